//! `/openapi.json`: an OpenAPI 3.1 document generated from the code — request schemas from the wire
//! types the server parses with, response schemas from the types it writes, and every status code a
//! route can answer with, each with its body schema.

use crate::api::response::*;
use crate::api::wire::{ChatCompletionRequest, CompletionRequest, Sampling};
use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Value, json};

use super::routes::{DetokenizeRequest, TokenizeRequest};

fn generator(serialize: bool) -> SchemaGenerator {
    let mut s = SchemaSettings::draft2020_12();
    s.definitions_path = "/components/schemas".into();
    s.meta_schema = None;
    if serialize {
        s = s.for_serialize();
    }
    s.into_generator()
}

/// The request schema of an endpoint: its own fields plus the shared sampling fields, nothing else
/// (the server refuses unknown fields).
fn request_with_sampling<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    let mut own = T::json_schema(g).to_value();
    let sampling = Sampling::json_schema(g).to_value();
    if let (Some(props), Some(extra)) = (
        own.get_mut("properties").and_then(Value::as_object_mut),
        sampling.get("properties").and_then(Value::as_object),
    ) {
        for (k, v) in extra {
            props.insert(k.clone(), v.clone());
        }
    }
    own["additionalProperties"] = json!(false);
    own
}

fn error_responses(codes: &[u16]) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for c in codes {
        let description = match c {
            400 => "Invalid input (the message names the field and the limit)",
            401 => "Missing or invalid API key",
            404 => "Unknown model or endpoint",
            413 => "Prompt + max_tokens over the context, or body too large",
            429 => "Queue or tenant quota full (see Retry-After)",
            500 => "Generation failed inside the engine",
            503 => "Shutting down",
            504 => "Deadline passed before the first token",
            _ => "Error",
        };
        let mut r = json!({
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        });
        if *c == 429 {
            r["headers"] =
                json!({"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait"}});
        }
        out.insert(c.to_string(), r);
    }
    out
}

fn operation(summary: &str, request: Option<&str>, ok: Value, errors: &[u16], secured: bool) -> Value {
    let mut responses = error_responses(errors);
    responses.insert("200".into(), ok);
    let mut op = json!({"summary": summary, "responses": responses});
    if let Some(r) = request {
        op["requestBody"] = json!({
            "required": true,
            "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{r}")}}}
        });
    }
    if secured {
        op["security"] = json!([{"bearer": []}]);
    }
    op
}

fn json_ok(schema: &str) -> Value {
    json!({"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}})
}

fn generation_ok(schema: &str) -> Value {
    json!({"description": "The answer, or with `stream: true` an SSE stream of chunks ending in `data: [DONE]`",
    "content": {
        "application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}},
        "text/event-stream": {"schema": {"type": "string"}}
    }})
}

/// `chat_template_kwargs` with the limits the server enforces (serve/prompt.rs).
fn with_kwargs_limits(mut chat: Value) -> Value {
    use super::prompt::{MAX_KWARGS_BYTES, MAX_KWARGS_KEYS};
    use modelfleet_engine::tokenizer::ChatTemplate;
    let description = format!(
        "Extra variables for the chat template (e.g. `{{\"enable_thinking\": false}}` for Qwen3): at most \
         {MAX_KWARGS_KEYS} identifier keys and {MAX_KWARGS_BYTES} bytes of JSON; the names the server sets \
         itself are refused."
    );
    chat["properties"]["chat_template_kwargs"] = json!({
        "type": ["object", "null"],
        "description": description,
        "maxProperties": MAX_KWARGS_KEYS,
        "propertyNames": {
            "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$",
            "not": {"enum": ChatTemplate::RESERVED}
        },
        "additionalProperties": true
    });
    chat
}

/// The document.
pub fn document() -> Value {
    let mut req = generator(false);
    let mut res = generator(true);
    let chat_req = request_with_sampling::<ChatCompletionRequest>(&mut req);
    let completion_req = request_with_sampling::<CompletionRequest>(&mut req);
    let tokenize_req = TokenizeRequest::json_schema(&mut req).to_value();
    let detokenize_req = DetokenizeRequest::json_schema(&mut req).to_value();
    for name in [
        res.subschema_for::<ChatCompletion>(),
        res.subschema_for::<ChatCompletionChunk>(),
        res.subschema_for::<Completion>(),
        res.subschema_for::<ModelList>(),
        res.subschema_for::<TokenizeResponse>(),
        res.subschema_for::<DetokenizeResponse>(),
        res.subschema_for::<ErrorBody>(),
    ] {
        let _ = name;
    }
    let mut schemas = req.take_definitions(true);
    schemas.extend(res.take_definitions(true));
    schemas.insert("ChatCompletionRequest".into(), with_kwargs_limits(chat_req));
    schemas.insert("CompletionRequest".into(), completion_req);
    schemas.insert("TokenizeRequest".into(), with_kwargs_limits(tokenize_req));
    schemas.insert("DetokenizeRequest".into(), detokenize_req);
    let gen_errors = [400, 401, 404, 413, 429, 500, 503, 504];
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "modelfleet runtime",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "OpenAI-compatible API of a modelfleet runtime pod"
        },
        "paths": {
            "/v1/chat/completions": {"post": operation("Chat completion", Some("ChatCompletionRequest"), generation_ok("ChatCompletion"), &gen_errors, true)},
            "/v1/completions": {"post": operation("Text completion", Some("CompletionRequest"), generation_ok("Completion"), &gen_errors, true)},
            "/v1/models": {"get": operation("Models this server serves", None, json_ok("ModelList"), &[401], true)},
            "/tokenize": {"post": operation("Tokenize a prompt or chat messages", Some("TokenizeRequest"), json_ok("TokenizeResponse"), &[400, 401, 404, 413], true)},
            "/detokenize": {"post": operation("Token ids to text", Some("DetokenizeRequest"), json_ok("DetokenizeResponse"), &[400, 401, 404, 413], true)},
            "/health": {"get": {"summary": "Liveness", "responses": {"200": {"description": "Alive", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/ready": {"get": {"summary": "Readiness", "responses": {
                "200": {"description": "Ready", "content": {"text/plain": {"schema": {"type": "string"}}}},
                "503": {"description": "Draining", "content": {"text/plain": {"schema": {"type": "string"}}}}}}}
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        }
    })
}

/// The document as this server serves it: `model` names the served model, and the request limits
/// in force are part of the schema, so generated clients (and fuzzers) see the real constraints.
pub fn document_for(served_name: &str, limits: &super::params::RequestLimits) -> Value {
    let mut doc = document();
    let schemas = &mut doc["components"]["schemas"];
    for req in ["ChatCompletionRequest", "CompletionRequest"] {
        let props = &mut schemas[req]["properties"];
        props["model"] = json!({"type": "string", "enum": [served_name]});
        props["n"] = json!({"type": ["integer", "null"], "minimum": 1, "maximum": limits.max_n});
        props["timeout"] = json!({"type": ["number", "null"], "exclusiveMinimum": 0});
    }
    doc
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_reference_resolves() {
        let doc = super::document();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for part in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &part[..part.find('"').unwrap()];
            assert!(schemas.contains_key(name), "dangling $ref {name}");
        }
        let chat = &schemas["ChatCompletionRequest"]["properties"];
        for field in [
            "messages",
            "temperature",
            "stream_options",
            "cache_salt",
            "priority",
            "chat_template_kwargs",
        ] {
            assert!(chat.get(field).is_some(), "chat request schema lacks {field}");
        }
    }
}
