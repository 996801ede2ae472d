//! Streaming answers (SSE) for both endpoints: an opening chunk per choice, a chunk per token (tool
//! calls parsed into `delta.tool_calls` and a thinking model's reasoning split into
//! `delta.reasoning_content` for chat), an error event if a choice failed after it started,
//! the usage chunk when asked for, then `data: [DONE]`.
//!
//! Invariants: the first event is awaited before answering, so a request that fails or times out before
//! producing anything gets a proper status code instead of a stream; a client that goes away stops the
//! writer, which drops the merged events and so aborts every choice (their KV blocks are freed); a
//! constraint that gives out mid-stream is reported as the caller's (`invalid_request_error`,
//! `constraint_failed`), an engine failure as ours.

use super::generate::{self, ChoiceOut, Running};
use super::openai::{chat_logprobs, completion_logprobs, unix_now};
use super::state::AppState;
use super::{reasoning, tools};
use crate::api::error::{ApiError, ApiErrorKind};
use crate::api::response::*;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use modelfleet_api::limits::{USAGE_COMMENT, usage_report};
use modelfleet_engine::sched::RequestEvent;
use modelfleet_engine::stop::FinishReason;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc::Sender;

/// Which endpoint a stream answers, and what its chunks carry.
pub enum Flavor {
    /// `chat.completion.chunk`s.
    Chat {
        id: String,
        with_logprobs: bool,
        /// Parse tool calls into `delta.tool_calls`.
        with_tools: bool,
        /// A thinking model's answers: where they start (`delta.reasoning_content`).
        reasoning: Option<reasoning::Start>,
    },
    /// `text_completion` chunks.
    Completion {
        id: String,
        with_logprobs: bool,
        /// Each choice's echoed prompt (empty without `echo`).
        echo: Vec<String>,
    },
}

/// What a stream tells of its token usage when it ends.
#[derive(Clone, Copy, Debug, Default)]
pub struct UsageOut {
    /// The usage chunk (`stream_options.include_usage`).
    pub chunk: bool,
    /// The `: modelfleet-usage …` comment the gateway reads (request header `x-modelfleet-usage`).
    pub report: bool,
}

/// Streams the choices as SSE (see the module header).
pub async fn stream_response(
    st: Arc<AppState>,
    (tenant, model, first_token_by): (String, String, Option<std::time::Instant>),
    running: Vec<Running>,
    flavor: Flavor,
    usage: UsageOut,
) -> Result<Response, ApiError> {
    let keys: Vec<(usize, u32)> = running.iter().map(|r| (r.prompt_index, r.index)).collect();
    let fan_out = running.len() > 1;
    let mut events = generate::merged(running);
    let first = generate::first_event(&mut events, first_token_by.filter(|_| fan_out)).await?;
    if keys.len() == 1
        && let Some((_, RequestEvent::Finished(f))) = &first
        && let Some(e) = generate::early_failure(&st, f)
    {
        return Err(e);
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let chunks = Chunks {
        st,
        tenant,
        model,
        created: unix_now(),
        parsers: tools::stream_parsers(&flavor_tools(&flavor), &keys),
        splitters: reasoning::stream_splitters(flavor_reasoning(&flavor), keys.len()),
        outs: keys.iter().map(|_| ChoiceOut::default()).collect(),
        keys,
        flavor,
        failure: None,
    };
    // The writer carries the request's span: a choice's end is recorded under it.
    let span = tracing::Span::current();
    tokio::spawn(tracing::Instrument::instrument(
        chunks.write(events, first, tx, usage),
        span,
    ));
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Ok(Sse::new(body).into_response())
}

/// The usage report the gateway reads (`modelfleet_api::limits`).
pub fn report(u: &UsageBody) -> String {
    usage_report(
        u.prompt_tokens as u64,
        u.prompt_tokens_details.cached_tokens as u64,
        u.completion_tokens as u64,
    )
}

/// One stream's writer: what it knows, and what it has seen so far.
struct Chunks {
    st: Arc<AppState>,
    tenant: String,
    model: String,
    created: u64,
    flavor: Flavor,
    /// (prompt index, choice index) per merged stream.
    keys: Vec<(usize, u32)>,
    outs: Vec<ChoiceOut>,
    parsers: Vec<Option<tools::parse::CallParser>>,
    /// A thinking model's reasoning splitters (one per choice).
    splitters: Vec<Option<reasoning::Splitter>>,
    /// The first choice that failed after starting.
    failure: Option<ApiError>,
}

type Merged = futures::stream::BoxStream<'static, (usize, RequestEvent)>;

impl Chunks {
    /// Writes the whole stream; returns early when the client has gone.
    async fn write(
        mut self,
        mut events: Merged,
        first: Option<(usize, RequestEvent)>,
        tx: Sender<Event>,
        usage: UsageOut,
    ) {
        for i in 0..self.keys.len() {
            if let Some(ev) = self.opening(i)
                && tx.send(ev).await.is_err()
            {
                return; // client gone: dropping `events` aborts every choice
            }
        }
        let mut next = first;
        while let Some((i, ev)) = next {
            if let Some(chunk) = self.chunk(i, &ev)
                && tx.send(chunk).await.is_err()
            {
                return;
            }
            next = events.next().await;
        }
        for ev in self.closing(usage) {
            if tx.send(ev).await.is_err() {
                return;
            }
        }
    }

    /// Choice `i`'s opening chunk: the assistant role for chat, the echoed prompt for completions.
    fn opening(&self, i: usize) -> Option<Event> {
        let index = self.keys[i].1;
        match &self.flavor {
            Flavor::Chat { .. } => Some(self.chat_chunk(
                vec![ChatChunkChoice {
                    index,
                    delta: ChatDelta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                        reasoning_content: None,
                        tool_calls: None,
                    },
                    logprobs: None,
                    finish_reason: None,
                }],
                None,
            )),
            Flavor::Completion { echo, .. } if !echo[i].is_empty() => {
                Some(self.completion_chunk(index, echo[i].clone(), None, None))
            }
            Flavor::Completion { .. } => None,
        }
    }

    /// The chunk for one event of choice `i`, if it says anything.
    fn chunk(&mut self, i: usize, ev: &RequestEvent) -> Option<Event> {
        let text = self.outs[i].apply(&self.st, &self.tenant, ev);
        let index = self.keys[i].1;
        let (lp, finish) = match ev {
            RequestEvent::Token(t) => (t.logprobs.clone(), None),
            RequestEvent::Finished(f) => {
                self.note_failure(f);
                (None, Some(f.reason.as_str().to_owned()))
            }
        };
        match &self.flavor {
            Flavor::Chat { with_logprobs, .. } => {
                let delta = reasoning::stream_delta(
                    self.splitters[i].as_mut(),
                    self.parsers[i].as_mut(),
                    &text,
                    finish.is_some(),
                );
                let empty = delta.tool_calls.is_none()
                    && delta.reasoning_content.is_none()
                    && delta.content.as_deref().is_none_or(str::is_empty);
                if empty && lp.is_none() && finish.is_none() {
                    return None;
                }
                let choice = ChatChunkChoice {
                    index,
                    delta,
                    logprobs: (*with_logprobs && lp.is_some())
                        .then(|| chat_logprobs(&self.st, lp.as_slice())),
                    finish_reason: finish.map(|f| tools::finish_reason(self.parsers[i].as_ref(), f)),
                };
                Some(self.chat_chunk(vec![choice], None))
            }
            Flavor::Completion { with_logprobs, .. } => {
                if text.is_empty() && lp.is_none() && finish.is_none() {
                    return None;
                }
                let lps = (*with_logprobs && lp.is_some()).then(|| {
                    let before = self.outs[i].text.len() - text.len();
                    completion_logprobs(&self.st, lp.as_slice(), before)
                });
                Some(self.completion_chunk(index, text, lps, finish))
            }
        }
    }

    /// Keeps the first failure of a choice that had started, to report after the chunks.
    fn note_failure(&mut self, f: &modelfleet_engine::sched::Finished) {
        if f.reason != FinishReason::Error || self.failure.is_some() {
            return;
        }
        let message = f.message.clone().unwrap_or_else(|| "generation failed".into());
        self.failure = Some(if f.error_type == Some("constraint") {
            ApiError {
                code: Some("constraint_failed".into()),
                ..ApiError::new(ApiErrorKind::InvalidRequest, message)
            }
        } else {
            ApiError::new(ApiErrorKind::Internal, message)
        });
    }

    /// After the last event: the failure, the usage chunk (when asked for), `[DONE]`.
    fn closing(&mut self, wanted: UsageOut) -> Vec<Event> {
        let mut out = Vec::new();
        if let Some(e) = self.failure.take() {
            out.push(Event::default().data(e.body()));
        }
        let usage = generate::usage(self.keys.iter().map(|k| k.0).zip(&self.outs));
        if wanted.report {
            out.push(Event::default().comment(format!("{} {}", USAGE_COMMENT, report(&usage))));
        }
        if wanted.chunk {
            out.push(match &self.flavor {
                Flavor::Chat { .. } => self.chat_chunk(vec![], Some(usage)),
                Flavor::Completion { id, .. } => sse_json(&Completion {
                    id: id.clone(),
                    object: "text_completion",
                    created: self.created,
                    model: self.model.clone(),
                    choices: vec![],
                    usage: Some(usage),
                }),
            });
        }
        out.push(Event::default().data("[DONE]"));
        out
    }

    fn chat_chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<UsageBody>) -> Event {
        let id = match &self.flavor {
            Flavor::Chat { id, .. } | Flavor::Completion { id, .. } => id.clone(),
        };
        sse_json(&ChatCompletionChunk {
            id,
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    fn completion_chunk(
        &self,
        index: u32,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish_reason: Option<String>,
    ) -> Event {
        let id = match &self.flavor {
            Flavor::Chat { id, .. } | Flavor::Completion { id, .. } => id.clone(),
        };
        sse_json(&Completion {
            id,
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: vec![CompletionChoice {
                index,
                text,
                logprobs,
                finish_reason,
            }],
            usage: None,
        })
    }
}

fn sse_json<T: serde::Serialize>(v: &T) -> Event {
    Event::default().data(serde_json::to_string(v).expect("response bodies serialise"))
}

/// Where a chat stream's answers start, when the model thinks.
fn flavor_reasoning(flavor: &Flavor) -> Option<reasoning::Start> {
    match flavor {
        Flavor::Chat { reasoning, .. } => *reasoning,
        Flavor::Completion { .. } => None,
    }
}

/// The id prefix of tool calls, when a chat stream parses them.
fn flavor_tools(flavor: &Flavor) -> Option<String> {
    match flavor {
        Flavor::Chat {
            id, with_tools: true, ..
        } => Some(id.clone()),
        _ => None,
    }
}
