//! From a request's body, messages or prompts to token ids, off the async workers: parsing a large body,
//! rendering a chat template and tokenizing a large prompt take real CPU time (a 4 MB message takes
//! seconds), so they run on the blocking pool, at most [`PromptWork`]'s permits at once, while the workers keep answering `/health`,
//! `/ready` and `/metrics`.
//!
//! `chat_template_kwargs` ([`check_template_kwargs`]) are checked before anything is rendered: an object
//! of at most [`MAX_KWARGS_KEYS`] identifier keys and [`MAX_KWARGS_BYTES`] of JSON, none of them a name
//! the server sets itself.
//!
//! Invariant: a prompt that cannot fit the context is refused before anything is rendered or
//! tokenized when that can be told from its size alone ([`Tokenizer::min_tokens_for`]: no token
//! stands for more bytes than its own string holds), so an oversized body costs a length check.

use super::params::context_error;
use super::reasoning::{self, Start};
use super::state::AppState;
use crate::api::error::{ApiError, ApiErrorKind};
use crate::api::wire::Prompt;
use modelfleet_engine::tokenizer::{ChatMessage, ChatTemplate};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Permits for rendering and tokenizing: one per core, so prompt work never takes more than the machine
/// has while the engine runs.
pub struct PromptWork(Semaphore);

impl Default for PromptWork {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self(Semaphore::new(cores.max(1)))
    }
}

/// Runs `f` on the blocking pool once a permit is free.
async fn offload<T: Send + 'static>(
    st: &Arc<AppState>,
    f: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let _permit = st
        .prompt_work
        .0
        .acquire()
        .await
        .map_err(|_| ApiError::new(ApiErrorKind::Unavailable, "the server is shutting down"))?;
    let st = st.clone();
    tokio::task::spawn_blocking(move || f(&st))
        .await
        .unwrap_or_else(|e| {
            Err(ApiError::new(
                ApiErrorKind::Internal,
                format!("prompt work failed: {e}"),
            ))
        })
}

/// Bodies up to this size are parsed in place; larger ones on the blocking pool (a 4 MB body takes
/// long enough to parse, in a debug build seconds, to stall the workers that answer the probes).
const PARSE_INLINE_BYTES: usize = 64 << 10;

/// Parses a request body with `parse` (the strict wire parser), off the async workers if it is large.
pub async fn parse<T: Send + 'static>(
    st: &Arc<AppState>,
    body: axum::body::Bytes,
    parse: fn(&[u8]) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    if body.len() <= PARSE_INLINE_BYTES {
        return parse(&body);
    }
    offload(st, move |_| parse(&body)).await
}

/// 413 now if `bytes` of text cannot fit the context whatever they tokenize to.
fn check_size(st: &AppState, param: &str, texts: &[&str]) -> Result<(), ApiError> {
    let limit = st.engine.max_model_len().min(st.engine.kv_capacity_tokens());
    let tok = &st.model().tokenizer;
    let at_least: usize = texts.iter().map(|t| tok.min_tokens_for(t)).sum();
    if at_least >= limit {
        return Err(context_error(
            param,
            format!(
                "the prompt ({} bytes) is at least {at_least} tokens; the context limit is {limit} tokens",
                texts.iter().map(|t| t.len()).sum::<usize>()
            ),
        ));
    }
    Ok(())
}

/// Most keys in `chat_template_kwargs`.
pub const MAX_KWARGS_KEYS: usize = 32;
/// Most bytes of `chat_template_kwargs` as JSON.
pub const MAX_KWARGS_BYTES: usize = 16 << 10;

/// Refuses `chat_template_kwargs` over the limits, with a key that is not an identifier (a template
/// could not read it) or one the server sets itself, naming the field.
pub fn check_template_kwargs(
    kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<(), ApiError> {
    const FIELD: &str = "chat_template_kwargs";
    let Some(kwargs) = kwargs else { return Ok(()) };
    if kwargs.len() > MAX_KWARGS_KEYS {
        return Err(ApiError::invalid(
            FIELD,
            format!(
                "`{FIELD}` may hold at most {MAX_KWARGS_KEYS} keys, got {}",
                kwargs.len()
            ),
        ));
    }
    let bytes = serde_json::to_string(kwargs).map_or(usize::MAX, |s| s.len());
    if bytes > MAX_KWARGS_BYTES {
        return Err(ApiError::invalid(
            FIELD,
            format!("`{FIELD}` may be at most {MAX_KWARGS_BYTES} bytes of JSON, got {bytes}"),
        ));
    }
    for key in kwargs.keys() {
        let field = format!("{FIELD}.{key}");
        let mut chars = key.chars();
        let identifier = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && key.len() <= 64;
        if !identifier {
            return Err(ApiError::invalid(
                &field,
                format!("`{FIELD}` keys must be identifiers (letters, digits, `_`; at most 64), got {key:?}"),
            ));
        }
        if ChatTemplate::RESERVED.contains(&key.as_str()) {
            return Err(ApiError::invalid(
                &field,
                format!("`{field}`: the server sets `{key}` itself; it cannot be passed"),
            ));
        }
    }
    Ok(())
}

/// What a chat prompt is rendered from.
pub struct ChatInput {
    /// The messages, as the template sees them.
    pub messages: Vec<ChatMessage>,
    /// The function list, for a template that renders tools.
    pub tools: Option<serde_json::Value>,
    /// Open the assistant's turn.
    pub add_generation_prompt: bool,
    /// `chat_template_kwargs` (checked).
    pub kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A rendered and tokenized chat prompt.
pub struct ChatPrompt {
    /// The token ids.
    pub ids: Vec<u32>,
    /// Where a thinking model's answer starts (`None`: the model does not think).
    pub start: Option<Start>,
}

/// The chat's prompt: `messages` (and `tools`, the function list the template may describe, and the
/// request's `chat_template_kwargs`) rendered with the model's template, then tokenized.
pub async fn chat(st: &Arc<AppState>, input: ChatInput) -> Result<ChatPrompt, ApiError> {
    let ChatInput {
        messages,
        tools,
        add_generation_prompt,
        kwargs,
    } = input;
    let texts: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
    check_size(st, "messages", &texts)?;
    if st.model().chat_template.is_none() {
        return Err(ApiError::invalid(
            "messages",
            "this model has no chat template; use /v1/completions",
        ));
    }
    offload(st, move |st| {
        let md = st.model();
        let template = md.chat_template.as_ref().expect("checked above");
        let text = template
            .render_with(&messages, tools.as_ref(), add_generation_prompt, kwargs.as_ref())
            .map_err(|e| {
                ApiError::invalid("messages", format!("the chat template refused the messages: {e}"))
            })?;
        check_size(st, "messages", &[&text])?;
        let ids = md
            .tokenizer
            .encode(&text, false)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        let start = st.thinking.then(|| reasoning::start_of(&text));
        Ok(ChatPrompt { ids, start })
    })
    .await
}

/// The completion's prompts as token ids (texts tokenized with the tokenizer's special tokens, e.g.
/// BOS, when `add_special_tokens`).
pub async fn completion(
    st: &Arc<AppState>,
    prompt: Prompt,
    add_special_tokens: bool,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let texts = match prompt {
        Prompt::Tokens(ids) => return Ok(vec![ids]),
        Prompt::TokenLists(lists) => return Ok(lists),
        Prompt::Text(t) => vec![t],
        Prompt::Texts(ts) => ts,
    };
    for t in &texts {
        check_size(st, "prompt", &[t])?;
    }
    offload(st, move |st| {
        texts
            .iter()
            .map(|t| {
                st.model()
                    .tokenizer
                    .encode(t, add_special_tokens)
                    .map_err(|e| ApiError::invalid("prompt", e.to_string()))
            })
            .collect()
    })
    .await
}

/// How many prompts a completions request holds (before anything is tokenized).
pub fn count(prompt: &Prompt) -> usize {
    match prompt {
        Prompt::Text(_) | Prompt::Tokens(_) => 1,
        Prompt::Texts(ts) => ts.len(),
        Prompt::TokenLists(ls) => ls.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: serde_json::Value) -> Result<(), ApiError> {
        check_template_kwargs(v.as_object())
    }

    #[test]
    fn template_kwargs_are_bounded_and_never_shadow_the_servers_variables() {
        assert!(check(json!({"enable_thinking": false, "documents": [{"t": "x"}]})).is_ok());
        assert!(check_template_kwargs(None).is_ok());
        for (kwargs, field, fragment) in [
            (
                json!({"messages": []}),
                "chat_template_kwargs.messages",
                "sets `messages` itself",
            ),
            (
                json!({"add_generation_prompt": false}),
                "chat_template_kwargs.add_generation_prompt",
                "itself",
            ),
            (
                json!({"bos_token": "x"}),
                "chat_template_kwargs.bos_token",
                "itself",
            ),
            (
                json!({"raise_exception": 1}),
                "chat_template_kwargs.raise_exception",
                "itself",
            ),
            (
                json!({"enable-thinking": true}),
                "chat_template_kwargs.enable-thinking",
                "identifiers",
            ),
            (json!({"": true}), "chat_template_kwargs.", "identifiers"),
        ] {
            let e = check(kwargs).unwrap_err();
            assert_eq!((e.status(), e.param.as_deref()), (400, Some(field)));
            assert!(e.message.contains(fragment), "{}", e.message);
        }
        let many: serde_json::Map<_, _> = (0..33).map(|i| (format!("k{i}"), json!(i))).collect();
        let e = check_template_kwargs(Some(&many)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("chat_template_kwargs"));
        assert!(e.message.contains("at most 32 keys, got 33"), "{}", e.message);
        let e = check(json!({"big": "x".repeat(MAX_KWARGS_BYTES)})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("chat_template_kwargs"));
        assert!(e.message.contains("at most 16384 bytes"), "{}", e.message);
    }
}
