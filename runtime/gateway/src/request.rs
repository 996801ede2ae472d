//! What the gateway reads of a request body — `model`, `stream`, `cache_salt`, `timeout`, and the
//! messages, prompt or embedding input for the affinity key — and nothing else: the body is forwarded unchanged, so
//! fields the gateway does not know (`tools`, `response_format`, …) reach the pod as sent, and the
//! pod's strict validation stays the one place that refuses bad input.
//!
//! The affinity key is tenant scope ‖ adapter ‖ `cache_salt` ‖ the first characters of the rendered
//! prompt — the same things the pods' prefix-cache block hashes start from, so requests that could
//! share cached blocks share a key, and requests that could not (another tenant, adapter or salt) do
//! not. Characters stand in for tokens: no tokenizer is needed here.

use crate::ring::hash64;
use modelfleet_api::error::ApiError;
use serde::Deserialize;
use serde_json::Value;

/// The fields the gateway reads.
#[derive(Deserialize, Debug, Default)]
pub struct Peek {
    /// Served model or adapter name.
    #[serde(default)]
    pub model: Option<Value>,
    /// SSE streaming.
    #[serde(default)]
    pub stream: Option<Value>,
    /// Narrows the prefix-cache scope.
    #[serde(default)]
    pub cache_salt: Option<Value>,
    /// Seconds before the request is abandoned.
    #[serde(default)]
    pub timeout: Option<Value>,
    /// Chat messages.
    #[serde(default)]
    pub messages: Option<Value>,
    /// Completion prompt(s).
    #[serde(default)]
    pub prompt: Option<Value>,
    /// Embedding input(s) (routed by their first characters like a prompt).
    #[serde(default)]
    pub input: Option<Value>,
}

/// A request body as routing needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    /// The `model` field.
    pub model: String,
    /// Whether the answer is an SSE stream.
    pub stream: bool,
    /// `cache_salt`, if a string.
    pub cache_salt: Option<String>,
    /// `timeout` in seconds, if a positive number.
    pub timeout: Option<f64>,
    /// The first characters of the rendered prompt.
    pub prefix: String,
}

/// Reads `body` (JSON). Only a body that is not a JSON object, or lacks a string `model`, is refused
/// here; everything else is the pod's to judge.
pub fn peek(body: &[u8], prefix_chars: usize) -> Result<Routed, ApiError> {
    let not_object =
        |why: String| ApiError::invalid("body", format!("the request body must be a JSON object{why}"));
    // serde would also take a JSON array as a struct.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(not_object(String::new()));
    }
    let p: Peek = serde_json::from_slice(body).map_err(|e| not_object(format!(": {e}")))?;
    let model = match p.model {
        Some(Value::String(m)) => m,
        Some(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
        None => return Err(ApiError::invalid("model", "`model` is required")),
    };
    Ok(Routed {
        model,
        stream: matches!(p.stream, Some(Value::Bool(true))),
        cache_salt: match p.cache_salt {
            Some(Value::String(s)) => Some(s),
            _ => None,
        },
        timeout: p
            .timeout
            .and_then(|t| t.as_f64())
            .filter(|t| *t > 0.0 && t.is_finite()),
        prefix: rendered_prefix(
            p.messages.as_ref(),
            p.prompt.as_ref().or(p.input.as_ref()),
            prefix_chars,
        ),
    })
}

fn text_of(content: &Value, out: &mut String) {
    match content {
        Value::String(s) => out.push_str(s),
        Value::Array(parts) => {
            for part in parts {
                if let Some(t) = part.get("text").and_then(Value::as_str) {
                    out.push_str(t);
                }
            }
        }
        _ => {}
    }
}

/// `role\ncontent\n` per message (or the first prompt), cut to `limit` characters.
fn rendered_prefix(messages: Option<&Value>, prompt: Option<&Value>, limit: usize) -> String {
    let mut out = String::new();
    if let Some(Value::Array(messages)) = messages {
        for m in messages {
            if out.chars().count() >= limit {
                break;
            }
            out.push_str(m.get("role").and_then(Value::as_str).unwrap_or_default());
            out.push('\n');
            if let Some(c) = m.get("content") {
                text_of(c, &mut out);
            }
            out.push('\n');
        }
    } else if let Some(p) = prompt {
        let first = match p {
            Value::Array(items) => items.first().unwrap_or(p),
            other => other,
        };
        match first {
            Value::String(s) => out.push_str(s),
            other => out.push_str(&other.to_string()),
        }
    }
    out.chars().take(limit).collect()
}

/// The affinity key's ring position: tenant scope ‖ adapter ‖ cache salt ‖ prompt prefix, each
/// length-prefixed so no two different tuples hash the same bytes.
pub fn affinity_key(scope: &str, adapter: Option<&str>, r: &Routed) -> u64 {
    let mut bytes = Vec::with_capacity(r.prefix.len() + 64);
    for part in [
        scope,
        adapter.unwrap_or_default(),
        r.cache_salt.as_deref().unwrap_or_default(),
        &r.prefix,
    ] {
        bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
        bytes.extend_from_slice(part.as_bytes());
    }
    hash64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str, expected: Result<(&str, bool, &str), &str>) {
        match (peek(body.as_bytes(), 24), expected) {
            (Ok(r), Ok((model, stream, prefix))) => {
                assert_eq!(
                    (r.model.as_str(), r.stream, r.prefix.as_str()),
                    (model, stream, prefix),
                    "{body}"
                )
            }
            (Err(e), Err(fragment)) => assert!(e.message.contains(fragment), "{body}: {e:?}"),
            (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn bodies() {
        check(
            r#"{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}]}"#,
            Ok(("m", false, "system\nYou are terse.\nus")), // cut at 24 characters
        );
        check(
            r#"{"model":"m","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
            Ok(("m", true, "user\nab\n")),
        );
        check(
            r#"{"model":"m","prompt":"once upon a time there was a"}"#,
            Ok(("m", false, "once upon a time there w")),
        );
        check(
            r#"{"model":"m","prompt":["first","second"]}"#,
            Ok(("m", false, "first")),
        );
        check(r#"{"model":"m","prompt":[[1,2,3]]}"#, Ok(("m", false, "[1,2,3]")));
        // Unknown fields and odd types are the pod's to judge.
        check(
            r#"{"model":"m","tools":[{"x":1}],"stream":"yes","messages":7}"#,
            Ok(("m", false, "")),
        );
        check(r#"{"messages":[]}"#, Err("`model` is required"));
        check(r#"{"model":3}"#, Err("`model` must be a string"));
        check("[1]", Err("must be a JSON object"));
        check("{", Err("must be a JSON object"));
    }

    #[test]
    fn keys_separate_scope_adapter_and_salt() {
        let r = peek(br#"{"model":"m","prompt":"same words"}"#, 512).unwrap();
        let salted = peek(br#"{"model":"m","prompt":"same words","cache_salt":"s"}"#, 512).unwrap();
        let base = affinity_key("tenant:a", None, &r);
        assert_eq!(base, affinity_key("tenant:a", None, &r.clone()));
        assert_ne!(base, affinity_key("tenant:b", None, &r));
        assert_ne!(base, affinity_key("tenant:a", Some("sql"), &r));
        assert_ne!(base, affinity_key("tenant:a", None, &salted));
        // Length prefixes: moving characters between parts changes the key.
        assert_ne!(
            affinity_key("ab", Some("c"), &r),
            affinity_key("a", Some("bc"), &r)
        );
    }
}
