//! OpenAI response bodies (what the server writes), shared by the handlers and the OpenAPI document.
//! Field names and shapes are OpenAI's (`finish_reason: tool_calls` ends an answer that called tools);
//! `finish_reason` adds `cancelled`, `timeout` and `error` (docs/design.md), and
//! `usage.prompt_tokens_details.cached_tokens` reports prefix-cache hits.

use schemars::JsonSchema;
use serde::Serialize;
use std::collections::BTreeMap;

/// `usage`.
#[derive(Serialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq)]
pub struct UsageBody {
    /// Prompt tokens (counted once, whatever `n`).
    pub prompt_tokens: usize,
    /// Generated tokens over all choices.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Details of the prompt tokens.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Serialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// One alternative of a chat logprob.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// A chat token's logprob.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<TopLogprob>,
}

/// A chat choice's `logprobs`.
#[derive(Serialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// An assistant message.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The generated text (`null` when the answer is tool calls only, or a thinking model's answer
    /// ended inside its reasoning).
    pub content: Option<String>,
    /// A thinking model's reasoning (its leading `<think>…</think>` block, without the tags); absent
    /// for other models and when there was none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The calls the model made, when `tools` were given and it called any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A tool call in an answer.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// `call_…`: a later `tool` message answers it by this id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// A called function.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as JSON text (valid against its `parameters`, unless generation was cut short).
    pub arguments: String,
}

/// A streamed piece of a tool call: the first piece of a call has its `id`, `type` and name, later
/// pieces add to `arguments`.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ToolCallDelta {
    /// Which call of the choice (0, 1, …).
    pub index: u32,
    /// The call's id (first piece only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first piece only).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<&'static str>,
    /// The function's name and an arguments fragment.
    pub function: FunctionCallDelta,
}

/// A streamed piece of a called function.
#[derive(Serialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct FunctionCallDelta {
    /// The function's name (first piece only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next fragment of the arguments' JSON text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// One chat choice.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ChatChoice {
    /// Its index.
    pub index: u32,
    /// The message.
    pub message: AssistantMessage,
    /// Logprobs, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length`, `tool_calls`, `cancelled`, `timeout` or `error`.
    pub finish_reason: String,
}

/// `POST /v1/chat/completions` (non-streaming).
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: UsageBody,
}

/// A streamed chat delta.
#[derive(Serialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct ChatDelta {
    /// `assistant` in the first chunk of a choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning (thinking models: the text inside the leading `<think>…</think>` block).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// New tool-call pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a chat chunk.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ChatChunkChoice {
    /// Its index.
    pub index: u32,
    /// What is new.
    pub delta: ChatDelta,
    /// Logprobs of the new tokens, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Set in the choice's last chunk.
    pub finish_reason: Option<String>,
}

/// One SSE chunk of a streamed chat completion.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ChatCompletionChunk {
    /// Same for every chunk of a response.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// Choices with news (empty in the usage chunk).
    pub choices: Vec<ChatChunkChoice>,
    /// Only in the last chunk, with `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageBody>,
}

/// A completion choice's `logprobs` (the legacy shape).
#[derive(Serialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities.
    pub token_logprobs: Vec<f32>,
    /// The most likely alternatives per token, text → logprob.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

/// One completion choice (also the choice of a streamed chunk).
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct CompletionChoice {
    /// Its index (prompt index × n + choice).
    pub index: u32,
    /// The text (new text, in a chunk).
    pub text: String,
    /// Logprobs, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// Set when the choice ended.
    pub finish_reason: Option<String>,
}

/// `POST /v1/completions` (and each SSE chunk of a streamed one, with `object`
/// `text_completion` too, as OpenAI does).
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct Completion {
    /// `cmpl-…`.
    pub id: String,
    /// `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// The choices.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (in a stream: only the last chunk, with `include_usage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageBody>,
}

/// One entry of `GET /v1/models`.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ModelCard {
    /// The name to put in `model`.
    pub id: String,
    /// `model`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// `modelfleet`.
    pub owned_by: &'static str,
    /// The base model's name, for adapters; absent for the base model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The context limit.
    pub max_model_len: usize,
}

/// `GET /v1/models`.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ModelList {
    /// `list`.
    pub object: &'static str,
    /// The models.
    pub data: Vec<ModelCard>,
}

/// `POST /tokenize`.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct TokenizeResponse {
    /// The token ids.
    pub tokens: Vec<u32>,
    /// Their number.
    pub count: usize,
    /// The context limit.
    pub max_model_len: usize,
}

/// `POST /detokenize`.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct DetokenizeResponse {
    /// The text.
    pub prompt: String,
}

/// The error body (`{"error": {…}}`), for the OpenAPI document; [`crate::error::ApiError`] writes it.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The error's fields.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ErrorDetail {
    /// What went wrong, naming the field and the limit.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, …
    #[serde(rename = "type")]
    pub type_: String,
    /// The offending field, if one.
    pub param: Option<String>,
    /// A machine-readable code, if one.
    pub code: Option<String>,
}
