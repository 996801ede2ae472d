//! From a request's body, messages or prompts to token ids, off the async workers: parsing a large body,
//! rendering a chat template and tokenizing a large prompt take real CPU time (a 4 MB message takes
//! seconds), so they run on the blocking pool, at most [`PromptWork`]'s permits at once, while the workers keep answering `/health`,
//! `/ready` and `/metrics`.
//!
//! Invariant: a prompt that cannot fit the context is refused before anything is rendered or
//! tokenized when that can be told from its size alone ([`Tokenizer::min_tokens_for`]: no token
//! stands for more bytes than its own string holds), so an oversized body costs a length check.

use super::params::context_error;
use super::state::AppState;
use crate::api::error::{ApiError, ApiErrorKind};
use crate::api::wire::Prompt;
use modelfleet_engine::tokenizer::ChatMessage;
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

/// The chat's prompt: `messages` (and `tools`, the function list the template may describe) rendered
/// with the model's template, then tokenized.
pub async fn chat(
    st: &Arc<AppState>,
    messages: Vec<ChatMessage>,
    tools: Option<serde_json::Value>,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ApiError> {
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
            .render_with_tools(&messages, tools.as_ref(), add_generation_prompt)
            .map_err(|e| {
                ApiError::invalid("messages", format!("the chat template refused the messages: {e}"))
            })?;
        check_size(st, "messages", &[&text])?;
        md.tokenizer
            .encode(&text, false)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))
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
