//! OpenAI request bodies, parsed strictly: every field is known, typed, and either supported or refused
//! with a 400 naming it. Parameters beyond OpenAI use vLLM's names (`top_k`, `min_p`,
//! `repetition_penalty`, `min_tokens`, `ignore_eos`, `stop_token_ids`, `seed`, `cache_salt`, `priority`).
//!
//! Invariants: an unknown field is an error, never ignored; a field of the wrong JSON type is an error
//! naming its path (`messages[2].content`); OpenAI features not built yet (`audio`, `functions`, …)
//! are refused by name; harmless bookkeeping fields (`user`, `store`, `metadata`) are accepted and unused.
//! Range checks of sampling parameters live with the engine's `SamplingParams` validation.

use crate::error::ApiError;
use crate::structured::{ResponseFormat, StructuredOutputs, Tool, ToolCallIn, ToolChoice};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;

/// OpenAI features refused (400) until they are built, with what to say.
pub const NOT_SUPPORTED_YET: &[&str] = &[
    "functions",
    "function_call",
    "audio",
    "modalities",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "service_tier",
    "suffix",
    "best_of",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
];

/// `stop`: one string or several.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum Stop {
    /// A single stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a final chunk with `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// One part of a message's content; only text is supported.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ContentPart {
    /// Must be `text`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The text.
    #[serde(default)]
    pub text: Option<String>,
}

/// A message's content: a string, or a list of text parts.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Text parts, concatenated.
    Parts(Vec<ContentPart>),
}

/// One chat message.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The content (may be absent only for assistant messages).
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Optional participant name.
    #[serde(default)]
    pub name: Option<String>,
    /// An assistant message's tool calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// Sampling and stopping fields shared by both endpoints.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// vLLM: top-k, 0 or -1 disables.
    pub top_k: Option<i32>,
    /// vLLM: min-p.
    pub min_p: Option<f32>,
    /// Choices per prompt.
    pub n: Option<u32>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// vLLM: token ids that stop generation.
    pub stop_token_ids: Option<Vec<u32>>,
    /// Seed of the request's RNG.
    pub seed: Option<u64>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// vLLM repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string) → bias.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// vLLM: no EOS/stop ids before this many tokens.
    pub min_tokens: Option<u32>,
    /// vLLM: keep going past EOS.
    pub ignore_eos: Option<bool>,
    /// vLLM: drop special tokens from text (default true).
    pub skip_special_tokens: Option<bool>,
    /// Narrows the prefix-cache scope within the caller's tenant.
    pub cache_salt: Option<String>,
    /// Lower runs first, within the caller's tenant only.
    pub priority: Option<i32>,
    /// Seconds before the request is abandoned (capped by the server's maximum).
    pub timeout: Option<f64>,
    /// SSE streaming.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Accepted, unused (OpenAI bookkeeping).
    pub user: Option<String>,
    /// Accepted, unused.
    pub store: Option<bool>,
    /// Accepted, unused.
    pub metadata: Option<BTreeMap<String, String>>,
    /// OpenAI: `text`, `json_object`, or `json_schema` with a schema the output follows.
    pub response_format: Option<ResponseFormat>,
    /// vLLM: one of `json`, `regex`, `choice`, `grammar`, `json_object`.
    pub structured_outputs: Option<StructuredOutputs>,
    /// vLLM (older name): a JSON schema, as an object or its text.
    pub guided_json: Option<serde_json::Value>,
    /// vLLM (older name): a regular expression.
    pub guided_regex: Option<String>,
    /// vLLM (older name): the output is one of these strings.
    pub guided_choice: Option<Vec<String>>,
    /// vLLM (older name): a Lark grammar.
    pub guided_grammar: Option<String>,
}

impl Sampling {
    /// The constraint fields, for [`crate::structured::ConstraintFields::resolve`].
    pub fn constraint_fields(&self) -> crate::structured::ConstraintFields<'_> {
        crate::structured::ConstraintFields {
            response_format: self.response_format.as_ref(),
            structured_outputs: self.structured_outputs.as_ref(),
            guided_json: self.guided_json.as_ref(),
            guided_regex: self.guided_regex.as_ref(),
            guided_choice: self.guided_choice.as_ref(),
            guided_grammar: self.guided_grammar.as_ref(),
        }
    }
}

/// The fields of [`Sampling`], for the unknown-field check.
const SAMPLING_FIELDS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stop",
    "stop_token_ids",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "ignore_eos",
    "skip_special_tokens",
    "cache_salt",
    "priority",
    "timeout",
    "stream",
    "stream_options",
    "user",
    "store",
    "metadata",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
];

/// `POST /v1/chat/completions`.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
pub struct ChatCompletionRequest {
    /// Served model or adapter name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Legacy name of `max_completion_tokens`.
    pub max_tokens: Option<u32>,
    /// Most tokens to generate.
    pub max_completion_tokens: Option<u32>,
    /// Return logprobs of the sampled tokens.
    pub logprobs: Option<bool>,
    /// And this many alternatives (0–20; needs `logprobs`).
    pub top_logprobs: Option<u32>,
    /// Append the assistant turn's opening (default true).
    pub add_generation_prompt: Option<bool>,
    /// Functions the model may call.
    pub tools: Option<Vec<Tool>>,
    /// `none`, `auto` (the default with tools), `required`, or a named function.
    pub tool_choice: Option<ToolChoice>,
    /// Whether one answer may hold several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Extra variables for the chat template (Hugging Face's `apply_chat_template(**kwargs)`), e.g.
    /// `{"enable_thinking": false}` for Qwen3. Names the server sets itself (`messages`, `tools`,
    /// `add_generation_prompt`, `bos_token`, `eos_token`, …) are refused; at most 32 keys and 16 KiB.
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Sampling and stopping (parsed separately so errors keep their field paths).
    #[serde(skip)]
    pub sampling: Sampling,
}

const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "add_generation_prompt",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
];

/// A completions prompt: text, texts, token ids, or lists of token ids.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Several texts (one choice group each).
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    /// Served model or adapter name.
    pub model: String,
    /// The prompt(s).
    pub prompt: Prompt,
    /// Most tokens to generate (OpenAI's default is 16).
    pub max_tokens: Option<u32>,
    /// Return logprobs with this many alternatives (0–20).
    pub logprobs: Option<u32>,
    /// Prepend the prompt to the text.
    pub echo: Option<bool>,
    /// Sampling and stopping (parsed separately so errors keep their field paths).
    #[serde(skip)]
    pub sampling: Sampling,
}

const COMPLETION_FIELDS: &[&str] = &["model", "prompt", "max_tokens", "logprobs", "echo"];

/// Refuses fields that are not supported yet or unknown, naming the first one.
fn check_fields(object: &serde_json::Map<String, serde_json::Value>, own: &[&str]) -> Result<(), ApiError> {
    for key in object.keys() {
        if NOT_SUPPORTED_YET.contains(&key.as_str()) {
            return Err(ApiError::unsupported(key, "not supported yet"));
        }
        if !own.contains(&key.as_str()) && !SAMPLING_FIELDS.contains(&key.as_str()) {
            return Err(ApiError::unsupported(key, "not a known parameter"));
        }
    }
    Ok(())
}

fn typed<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = if path == "." { "body".to_string() } else { path };
        ApiError::invalid(param.clone(), format!("`{param}`: {}", e.inner()))
    })
}

/// Splits the body into the endpoint's own fields and the shared sampling fields, and types each.
/// JSON numbers with no fractional part are integers (`2.0` and `2` are the same JSON Schema
/// integer), so integer fields accept them; float fields accept integers anyway.
pub fn normalize_integers(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64())
                && f.fract() == 0.0
                && f.abs() < 9.0e15
            {
                *v = serde_json::Value::from(f as i64);
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(normalize_integers),
        serde_json::Value::Object(o) => o.values_mut().for_each(normalize_integers),
        _ => {}
    }
}

fn parse<T: DeserializeOwned>(body: &[u8], own: &[&str]) -> Result<(T, Sampling), ApiError> {
    let mut value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("body", format!("the body is not valid JSON: {e}")))?;
    normalize_integers(&mut value);
    let serde_json::Value::Object(object) = value else {
        return Err(ApiError::invalid("body", "the body must be a JSON object"));
    };
    check_fields(&object, own)?;
    let (sampling, rest): (serde_json::Map<_, _>, serde_json::Map<_, _>) = object
        .into_iter()
        .partition(|(k, _)| SAMPLING_FIELDS.contains(&k.as_str()));
    Ok((
        typed(serde_json::Value::Object(rest))?,
        typed(serde_json::Value::Object(sampling))?,
    ))
}

/// Parses a chat completions body.
pub fn parse_chat(body: &[u8]) -> Result<ChatCompletionRequest, ApiError> {
    let (mut req, sampling): (ChatCompletionRequest, _) = parse(body, CHAT_FIELDS)?;
    req.sampling = sampling;
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    for (i, m) in req.messages.iter().enumerate() {
        if !["system", "developer", "user", "assistant", "tool"].contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!(
                    "`messages[{i}].role` must be system, developer, user, assistant or tool, got {:?}",
                    m.role
                ),
            ));
        }
        crate::structured::check_message_tools(i, m)?;
        if let Some(MessageContent::Parts(parts)) = &m.content {
            for (j, p) in parts.iter().enumerate() {
                if p.type_ != "text" || p.text.is_none() {
                    return Err(ApiError::unsupported(
                        &format!("messages[{i}].content[{j}].type"),
                        "not supported yet: only text content parts are",
                    ));
                }
            }
        }
        if m.content.is_none() && m.role != "assistant" {
            return Err(ApiError::invalid(
                format!("messages[{i}].content"),
                format!("`messages[{i}].content` is required"),
            ));
        }
    }
    Ok(req)
}

/// Parses a completions body.
pub fn parse_completion(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let (mut req, sampling): (CompletionRequest, _) = parse(body, COMPLETION_FIELDS)?;
    req.sampling = sampling;
    let empty = match &req.prompt {
        Prompt::Text(_) => false,
        Prompt::Texts(v) => v.is_empty(),
        Prompt::Tokens(v) => v.is_empty(),
        Prompt::TokenLists(v) => v.is_empty() || v.iter().any(Vec::is_empty),
    };
    if empty {
        return Err(ApiError::invalid("prompt", "`prompt` must not be empty"));
    }
    Ok(req)
}

impl MessageContent {
    /// The text of the content (parts concatenated).
    pub fn text(&self) -> String {
        match self {
            MessageContent::Text(t) => t.clone(),
            MessageContent::Parts(parts) => parts.iter().filter_map(|p| p.text.as_deref()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(r: Result<impl std::fmt::Debug, ApiError>) -> ApiError {
        r.expect_err("expected an error")
    }

    #[test]
    fn accepts_openai_and_vllm_fields() {
        let body = br#"{"model":"tiny","messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
            "max_tokens":8,"temperature":0,"top_k":-1,"min_p":0.1,"seed":7,"stop":"\n","stream":true,
            "stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,"logit_bias":{"42":-100},
            "user":"u1","store":false,"metadata":{"k":"v"},"cache_salt":"s","priority":-1,"min_tokens":2,
            "ignore_eos":false,"stop_token_ids":[2],"repetition_penalty":1.1,"timeout":30}"#;
        let r = parse_chat(body).unwrap();
        assert_eq!(r.messages[1].content.as_ref().unwrap().text(), "hi there");
        assert_eq!(
            r.sampling.stop.clone().unwrap().into_vec(),
            vec!["\n".to_string()]
        );
        assert_eq!(r.sampling.top_k, Some(-1));
        assert!(r.sampling.stream_options.unwrap().include_usage);
        let c = parse_completion(
            br#"{"model":"tiny","prompt":[[1,2,3],[4]],"max_tokens":4,"logprobs":3,"echo":true}"#,
        )
        .unwrap();
        assert_eq!(c.prompt, Prompt::TokenLists(vec![vec![1, 2, 3], vec![4]]));
    }

    fn check(body: &str, param: &str, fragment: &str) {
        let e = if body.contains("\"messages\"") {
            err_of(parse_chat(body.as_bytes()))
        } else {
            err_of(parse_completion(body.as_bytes()))
        };
        assert_eq!(e.status(), 400, "{body}");
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        assert!(
            e.message.contains(fragment),
            "{body}: {:?} lacks {fragment:?}",
            e.message
        );
    }

    #[test]
    fn refuses_with_the_field_named() {
        let m = r#""model":"tiny","messages":[{"role":"user","content":"x"}]"#;
        check(
            &format!("{{{m},\"functions\":[]}}"),
            "functions",
            "not supported yet",
        );
        check(
            &format!("{{{m},\"response_format\":{{\"type\":\"xml\"}}}}"),
            "response_format.type",
            "unknown variant",
        );
        check(
            &format!("{{{m},\"tools\":[{{\"type\":\"function\",\"function\":{{\"name\":\"f\",\"x\":1}}}}]}}"),
            "tools[0].function.x",
            "unknown field",
        );
        check(
            r#"{"model":"tiny","messages":[{"role":"tool","content":"42"}]}"#,
            "messages[0].tool_call_id",
            "is required",
        );
        check(
            r#"{"model":"tiny","messages":[{"role":"user","content":"x","tool_calls":[]}]}"#,
            "messages[0].tool_calls",
            "only for assistant",
        );
        check(
            &format!("{{{m},\"chat_template_kwargs\":[1]}}"),
            "chat_template_kwargs",
            "expected a map",
        );
        check(
            &format!("{{{m},\"temprature\":0.5}}"),
            "temprature",
            "not a known parameter",
        );
        check(
            &format!("{{{m},\"temperature\":\"hot\"}}"),
            "temperature",
            "invalid type",
        );
        check(
            &format!("{{{m},\"max_tokens\":-1}}"),
            "max_tokens",
            "invalid value",
        );
        check(r#"{"model":"tiny","messages":[]}"#, "messages", "at least one");
        check(
            r#"{"model":"tiny","messages":[{"role":"robot","content":"x"}]}"#,
            "messages[0].role",
            "got \"robot\"",
        );
        check(
            r#"{"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
            "messages[0].content",
            "",
        );
        check(
            r#"{"model":"tiny","messages":[{"role":"user"}]}"#,
            "messages[0].content",
            "is required",
        );
        check(r#"{"model":"tiny","prompt":""#, "body", "not valid JSON");
        check(r#"{"model":"tiny","prompt":[]}"#, "prompt", "must not be empty");
        check(
            r#"{"model":"tiny","prompt":"x","suffix":"y"}"#,
            "suffix",
            "not supported yet",
        );
        check(
            r#"{"model":"tiny","prompt":"x","best_of":2}"#,
            "best_of",
            "not supported yet",
        );
        check(r#"{"prompt":"x"}"#, "body", "missing field `model`");
        let e = err_of(parse_completion(b"[1,2]"));
        assert_eq!(e.param.as_deref(), Some("body"));
    }
}
