//! What crosses the boundary between the HTTP side and the step loop: a [`Request`] going in, a
//! stream of [`RequestEvent`]s coming out.
//!
//! Invariants: the tenant and the prefix-cache scope are set by the server from the authenticated
//! caller, never from the request body; every accepted request gets exactly one
//! [`RequestEvent::Finished`], last, whatever ends it (stop, length, cancel, deadline, error).

use crate::kv::RequestId;
use crate::lora::LoraAdapter;
use crate::sampling::{SampleOutput, ValidSamplingParams};
use crate::stop::FinishReason;
use std::sync::Arc;
use std::time::Instant;

/// A request as the scheduler receives it (prompt already tokenized and checked against the context).
#[derive(Debug)]
pub struct Request {
    /// The authenticated tenant: the unit of fairness, quotas and usage.
    pub tenant: String,
    /// The prefix-cache scope (the tenant, or the deployment when the operator chose so).
    pub cache_scope: String,
    /// The LoRA adapter applied, if any (its content digest is part of every block hash). Holding it
    /// keeps this generation's weights alive until the request ends, whatever the registry does.
    pub adapter: Option<Arc<LoraAdapter>>,
    /// A caller's `cache_salt`: narrows sharing to requests with the same salt.
    pub cache_salt: Option<String>,
    /// Lower runs first, and only among this tenant's requests.
    pub priority: i32,
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    /// Sampling and stopping parameters.
    pub params: ValidSamplingParams,
    /// When the request arrived (queue time is measured from here).
    pub arrival: Instant,
    /// When it must be finished; before its first token it then ends with [`FinishReason::Timeout`]
    /// and no output, after it with whatever was generated.
    pub deadline: Option<Instant>,
    /// When its first token must have been sampled: if it has not by then, it ends with
    /// [`FinishReason::Timeout`], no output and [`Finished::error_type`]
    /// [`FIRST_TOKEN_DEADLINE`] (the server answers 504 `first_token_deadline`, which a gateway may
    /// move elsewhere); after the first token it no longer matters.
    pub first_token_deadline: Option<Instant>,
}

/// [`Finished::error_type`] of a request whose first-token deadline passed.
pub const FIRST_TOKEN_DEADLINE: &str = "first_token_deadline";

/// Token counts of a finished request (the API's `usage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache on first admission.
    pub cached_tokens: usize,
    /// Generated tokens (including a final EOS or stop token).
    pub completion_tokens: usize,
}

/// When things happened to a request, for the latency metrics.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    /// Arrival at the server.
    pub arrival: Instant,
    /// First admitted into a batch.
    pub first_scheduled: Option<Instant>,
    /// First token sampled.
    pub first_token: Option<Instant>,
    /// Finished.
    pub finished: Instant,
    /// Times it was preempted (its KV freed and recomputed later).
    pub preemptions: u32,
    /// Steps that computed part of its prompt, up to its first token (the prefill's chunks; more than
    /// one when the prompt was longer than a step's budget, or shared steps with other requests').
    pub prefill_steps: u32,
}

/// One generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOut {
    /// The token id.
    pub token: u32,
    /// Text now safe to emit (may be empty while a stop string or a UTF-8 character is pending).
    pub text: String,
    /// Its logprob and top alternatives, when asked for.
    pub logprobs: Option<SampleOutput>,
}

/// The end of a request.
#[derive(Clone, Debug)]
pub struct Finished {
    /// Why it ended.
    pub reason: FinishReason,
    /// Text still held back when it ended (emit it after the last token).
    pub text: String,
    /// Token counts.
    pub usage: Usage,
    /// Latency facts.
    pub timings: Timings,
    /// For [`FinishReason::Error`] and [`FinishReason::Timeout`]: what happened, for the client.
    pub message: Option<String>,
    /// For [`FinishReason::Error`] from an engine error: its type ([`crate::EngineError::error_type`];
    /// `constraint` is the request's own structured-output constraint failing, not the engine).
    pub error_type: Option<&'static str>,
}

/// What the step loop sends about one request.
#[derive(Clone, Debug)]
pub enum RequestEvent {
    /// A token was generated.
    Token(TokenOut),
    /// The request ended; nothing follows.
    Finished(Finished),
}

/// Receives a request's events; the step loop owns the sending side.
pub type EventSender = tokio::sync::mpsc::UnboundedSender<RequestEvent>;
/// The caller's side of a request's events.
pub type EventReceiver = tokio::sync::mpsc::UnboundedReceiver<RequestEvent>;

/// A request together with its id and where its events go.
pub struct Submitted {
    /// The id the step loop knows it by.
    pub id: RequestId,
    /// The request.
    pub request: Request,
    /// Its events.
    pub events: EventSender,
}
