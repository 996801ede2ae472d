//! Submitting a request's choices to the engine and turning their event streams into an OpenAI
//! answer: collected into one JSON body, or streamed as SSE chunks by a task that stops — dropping
//! the engine streams, which aborts the requests — as soon as the client goes away.
//!
//! Invariants: a request refused by admission is answered 429 with `Retry-After` (503 when draining)
//! before anything is generated, and none of its choices is left running; a timeout before the first
//! token is a 504, after it the choice ends with `finish_reason: timeout`; a stream that fails after it
//! started ends with an `error` event and `[DONE]`; every finished choice is counted in the metrics and
//! logged as one JSON line (never with a key or prompt text).

use super::state::AppState;
use crate::adapters::ModelChoice;
use crate::api::error::{ApiError, ApiErrorKind};
use crate::api::response::{PromptTokensDetails, UsageBody};
use crate::metrics::RuntimeMetrics;
use crate::tenants::Tenant;
use futures::stream::{self, StreamExt};
use modelfleet_engine::lora::LoraAdapter;
use modelfleet_engine::sampling::{SampleOutput, ValidSamplingParams};
use modelfleet_engine::sched::{
    FIRST_TOKEN_DEADLINE, Finished, Rejection, Request, RequestEvent, RequestStream, TenantLimits,
};
use modelfleet_engine::stop::FinishReason;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One choice to generate.
pub struct ChoiceSpec {
    /// Index in the response.
    pub index: u32,
    /// Which prompt it continues (for usage: each prompt counts once).
    pub prompt_index: usize,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Its parameters (seed already varied per choice).
    pub params: ValidSamplingParams,
}

/// What is common to a request's choices.
pub struct JobSpec {
    /// The authenticated tenant.
    pub tenant: Arc<Tenant>,
    /// Request priority (within the tenant).
    pub priority: i32,
    /// The caller's `cache_salt`.
    pub cache_salt: Option<String>,
    /// The request's `timeout`, seconds.
    pub timeout: Option<f64>,
    /// When the HTTP request arrived.
    pub arrival: Instant,
    /// The `model` the caller named (echoed in responses).
    pub model: String,
    /// The adapter's weights, for a request naming an adapter (see [`acquire_adapter`]).
    pub adapter: Option<Arc<LoraAdapter>>,
    /// When its first token is due (`modelfleet_api::deadline`): past it, with no token sampled, the
    /// request ends and is answered 504 `first_token_deadline`.
    pub first_token_by: Option<Instant>,
}

impl JobSpec {
    /// When the request must be done: its `timeout` (at most the server's limit) after arrival.
    pub fn deadline(&self, st: &AppState) -> Instant {
        let timeout = self
            .timeout
            .unwrap_or(st.limits.max_timeout_secs)
            .min(st.limits.max_timeout_secs);
        self.arrival + Duration::from_secs_f64(timeout.max(0.0))
    }
}

/// Gets the weights of the adapter `choice` names (reloading them if they were evicted, waiting for
/// a memory slot until the request's deadline), or `None` for the base model.
pub async fn acquire_adapter(
    st: &AppState,
    choice: &ModelChoice,
    job: &JobSpec,
) -> Result<Option<Arc<LoraAdapter>>, ApiError> {
    match choice {
        ModelChoice::Base => Ok(None),
        ModelChoice::Adapter(name) => st
            .adapters
            .acquire(name, &job.tenant.id, job.deadline(st))
            .await
            .map(Some),
    }
}

/// A submitted choice.
pub struct Running {
    /// Index in the response.
    pub index: u32,
    /// Which prompt it continues.
    pub prompt_index: usize,
    /// The engine's events.
    pub stream: RequestStream,
}

/// Submits every choice as one group the admission gate takes whole or refuses (the refusal is the
/// answer; nothing was queued).
pub fn submit(st: &AppState, job: &JobSpec, choices: Vec<ChoiceSpec>) -> Result<Vec<Running>, ApiError> {
    let quota = TenantLimits {
        max_concurrent_requests: job.tenant.max_concurrent_requests.map(|v| v as usize),
        max_queued_tokens: job.tenant.max_queued_tokens.map(|v| v as usize),
        max_queued_requests: st.tenant_queue_share,
    };
    let deadline = job.deadline(st);
    let n = choices.iter().filter(|c| c.prompt_index == 0).count();
    let max_tokens = choices.first().and_then(|c| c.params.max_tokens).unwrap_or(0);
    let scope = st.cache_scope(&job.tenant);
    // A single choice's first-token deadline is the engine's (it ends the request even in the queue);
    // a fan-out's is kept over all its choices by the answer ([`first_event`]).
    let first_token_deadline = job.first_token_by.filter(|_| choices.len() == 1);
    let mut places = Vec::with_capacity(choices.len());
    let requests = choices
        .into_iter()
        .map(|c| {
            places.push((c.index, c.prompt_index));
            Request {
                tenant: job.tenant.id.clone(),
                cache_scope: scope.clone(),
                adapter: job.adapter.clone(),
                cache_salt: job.cache_salt.clone(),
                priority: job.priority,
                prompt: c.prompt,
                params: c.params,
                arrival: job.arrival,
                deadline: Some(deadline),
                first_token_deadline,
            }
        })
        .collect();
    match st.engine.submit_group(requests, quota) {
        Ok(streams) => {
            st.metrics.request_params(n, max_tokens);
            Ok(places
                .into_iter()
                .zip(streams)
                .map(|((index, prompt_index), stream)| Running {
                    index,
                    prompt_index,
                    stream,
                })
                .collect())
        }
        Err(r) => {
            st.metrics
                .requests_rejected
                .with_label_values(&[&st.served_name, &job.tenant.id, r.label()])
                .inc();
            Err(rejection_error(&r))
        }
    }
}

/// The HTTP answer to an admission refusal.
pub fn rejection_error(r: &Rejection) -> ApiError {
    match r {
        Rejection::ShuttingDown => ApiError::new(ApiErrorKind::Unavailable, r.to_string()),
        _ => ApiError {
            code: Some(r.label().into()),
            ..ApiError::new(ApiErrorKind::RateLimited { retry_after_secs: 1 }, r.to_string())
        },
    }
}

/// A choice's output so far.
#[derive(Default)]
pub struct ChoiceOut {
    /// Generated text.
    pub text: String,
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Per-token logprobs, when asked for.
    pub logprobs: Vec<SampleOutput>,
    /// How it ended.
    pub finished: Option<Finished>,
    last_token: Option<Instant>,
}

impl ChoiceOut {
    /// Applies one event; returns the text it adds.
    pub fn apply(&mut self, st: &AppState, tenant: &str, ev: &RequestEvent) -> String {
        match ev {
            RequestEvent::Token(t) => {
                let now = Instant::now();
                if let Some(prev) = self.last_token {
                    st.metrics
                        .inter_token(&st.served_name, tenant, (now - prev).as_secs_f64());
                }
                self.last_token = Some(now);
                self.tokens.push(t.token);
                if let Some(lp) = &t.logprobs {
                    self.logprobs.push(lp.clone());
                }
                self.text.push_str(&t.text);
                t.text.clone()
            }
            RequestEvent::Finished(f) => {
                super::trace::choice_finished(&st.served_name, f);
                self.text.push_str(&f.text);
                self.finished = Some(f.clone());
                f.text.clone()
            }
        }
    }

    /// The API's `finish_reason`.
    pub fn finish_reason(&self) -> String {
        self.finished
            .as_ref()
            .map_or(FinishReason::Error, |f| f.reason)
            .as_str()
            .to_owned()
    }
}

/// The error for a choice that ended before producing anything, if it did. A choice the failed engine
/// ended is a 503 (retry on another replica), not a 500.
pub fn early_failure(st: &AppState, f: &Finished) -> Option<ApiError> {
    if f.usage.completion_tokens > 0 {
        return None;
    }
    let message = f.message.clone().unwrap_or_else(|| f.reason.as_str().into());
    match f.reason {
        FinishReason::Timeout if f.error_type == Some(FIRST_TOKEN_DEADLINE) => {
            Some(modelfleet_api::deadline::passed(message))
        }
        FinishReason::Timeout => Some(ApiError::new(ApiErrorKind::Timeout, message)),
        FinishReason::Error if st.engine.failure().is_some() => {
            Some(ApiError::new(ApiErrorKind::Unavailable, message))
        }
        // The request's own constraint gave out (its lexer or parser over a per-token limit): the
        // caller's to change, as at validation.
        FinishReason::Error if f.error_type == Some("constraint") => Some(ApiError {
            code: Some("constraint_failed".into()),
            ..ApiError::new(ApiErrorKind::InvalidRequest, message)
        }),
        FinishReason::Error => Some(ApiError::new(ApiErrorKind::Internal, message)),
        FinishReason::Cancelled => Some(ApiError::new(ApiErrorKind::Unavailable, message)),
        FinishReason::Stop | FinishReason::Length => None,
    }
}

/// Counts a finished request and writes its usage line (the engine's finish hook: it runs for every
/// request, also those whose client is gone).
pub fn record(metrics: &RuntimeMetrics, model: &str, tenant: &str, f: &Finished) {
    metrics.finished(model, tenant, f);
    let u = f.usage;
    let t = f.timings;
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    let line = serde_json::json!({
        "event": "request_finished",
        "model": model,
        "tenant": tenant,
        "finish_reason": f.reason.as_str(),
        "prompt_tokens": u.prompt_tokens,
        "cached_tokens": u.cached_tokens,
        "completion_tokens": u.completion_tokens,
        "queue_seconds": t.first_scheduled.map(|s| secs(t.arrival, s)),
        "ttft_seconds": t.first_token.map(|s| secs(t.arrival, s)),
        "latency_seconds": secs(t.arrival, t.finished),
        "preemptions": t.preemptions,
    });
    // On the engine thread: a closed stdout must lose the line, never panic the engine.
    if !crate::logging::stdout_line(&line.to_string()) {
        metrics.log_write_errors.inc();
    }
}

/// Usage over all choices: each prompt counted once (with its first choice's cache hits).
pub fn usage<'a>(choices: impl Iterator<Item = (usize, &'a ChoiceOut)>) -> UsageBody {
    let mut u = UsageBody::default();
    let mut seen = std::collections::HashSet::new();
    for (prompt_index, c) in choices {
        let Some(f) = &c.finished else { continue };
        if seen.insert(prompt_index) {
            u.prompt_tokens += f.usage.prompt_tokens;
            u.prompt_tokens_details = PromptTokensDetails {
                cached_tokens: u.prompt_tokens_details.cached_tokens + f.usage.cached_tokens,
            };
        }
        u.completion_tokens += f.usage.completion_tokens;
    }
    u.total_tokens = u.prompt_tokens + u.completion_tokens;
    u
}

/// Every choice's events merged, tagged with the choice's position in `running`.
pub fn merged(running: Vec<Running>) -> stream::BoxStream<'static, (usize, RequestEvent)> {
    let streams = running.into_iter().enumerate().map(|(i, r)| {
        stream::unfold(r.stream, move |mut s| async move {
            s.next().await.map(|ev| ((i, ev), s))
        })
        .boxed()
    });
    stream::select_all(streams).boxed()
}

/// Every choice run to its end (non-streaming answers), with its place in the response.
pub struct Collected {
    /// (prompt index, response index) of each choice, in submission order.
    pub keys: Vec<(usize, u32)>,
    /// Each choice's output, in the same order.
    pub outs: Vec<ChoiceOut>,
}

impl Collected {
    /// Usage over all choices.
    pub fn usage(&self) -> UsageBody {
        usage(self.keys.iter().map(|k| k.0).zip(&self.outs))
    }
}

/// The first event of a request's choices, by `first_token_by` if given (a fan-out's first-token
/// deadline). Past it the caller drops the events, which aborts every choice.
pub async fn first_event(
    events: &mut futures::stream::BoxStream<'static, (usize, RequestEvent)>,
    first_token_by: Option<Instant>,
) -> Result<Option<(usize, RequestEvent)>, ApiError> {
    let Some(by) = first_token_by else {
        return Ok(events.next().await);
    };
    tokio::time::timeout_at(by.into(), events.next())
        .await
        .map_err(|_| {
            modelfleet_api::deadline::passed("no first token within the request's first-token deadline")
        })
}

/// Runs every choice to its end; a request whose every choice ended before its first token answers
/// with that error.
pub async fn collect(st: &AppState, job: &JobSpec, running: Vec<Running>) -> Result<Collected, ApiError> {
    let keys: Vec<(usize, u32)> = running.iter().map(|r| (r.prompt_index, r.index)).collect();
    let mut outs: Vec<ChoiceOut> = running.iter().map(|_| ChoiceOut::default()).collect();
    let fan_out = running.len() > 1;
    let mut events = merged(running);
    let first = first_event(&mut events, job.first_token_by.filter(|_| fan_out)).await?;
    let tenant = job.tenant.id.as_str();
    if let Some((i, ev)) = first {
        outs[i].apply(st, tenant, &ev);
    }
    while let Some((i, ev)) = events.next().await {
        outs[i].apply(st, tenant, &ev);
    }
    let errors: Vec<ApiError> = outs
        .iter()
        .filter_map(|o| o.finished.as_ref().and_then(|f| early_failure(st, f)))
        .collect();
    if errors.len() == outs.len()
        && let Some(e) = errors.into_iter().next()
    {
        return Err(e);
    }
    Ok(Collected { keys, outs })
}
