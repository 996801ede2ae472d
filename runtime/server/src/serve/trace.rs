//! The runtime's part of a request's trace (docs/operations.md, "Traces").
//!
//! [`traced`] wraps each generation and embedding endpoint: a SERVER span per request, the child of the
//! caller's `traceparent` (the gateway's attempt span), that lives until the response body ends — the
//! last SSE chunk, or the client's disconnect. Under it: `validate` (with `constraint` — compiled, or
//! a cache hit), `tokenize`, `adapter` (acquiring, loading if needed, the LoRA adapter), and, when a
//! choice finishes, `queue`, `prefill` (its chunks: the steps that carried the prompt) and `decode`,
//! timed by the engine ([`modelfleet_engine::sched::Timings`]) and recorded afterwards — the step loop
//! itself never touches a span. The request span carries the GenAI attributes (model, operation,
//! usage, finish reasons) and vLLM's latency names.
//!
//! Invariant: with tracing off, spans still exist for the log lines (their `trace_id` is the caller's,
//! if it sent one) and nothing is exported.

use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use modelfleet_engine::sched::Finished;
use modelfleet_telemetry::{genai, propagation};
use opentelemetry::KeyValue;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The middleware: the request's span around the handler and its response body.
pub async fn traced(req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let operation = match path.as_str() {
        "/v1/chat/completions" => "chat",
        "/v1/embeddings" => "embeddings",
        _ => "text_completion",
    };
    let remote = propagation::extract(req.headers());
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{} {path}", req.method()),
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = %req.method(),
        http.route = %path,
        http.response.status_code = Empty,
        { genai::OPERATION_NAME } = operation,
        { genai::TENANT } = Empty,
        trace_id = Empty,
    );
    let _ = span.set_parent(remote.clone());
    if let Some(id) = modelfleet_telemetry::trace_id(&span, &remote) {
        span.record("trace_id", id.as_str());
    }
    let resp = tracing::Instrument::instrument(next.run(req), span.clone()).await;
    let status = resp.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() || status.is_client_error() {
        span.record("otel.status_code", "error");
    }
    resp.map(|body| Body::new(Spanned { inner: body, span }))
}

/// A response body that keeps its request's span open (and current while it is polled) until the
/// body ends or is dropped.
struct Spanned {
    inner: Body,
    span: Span,
}

impl HttpBody for Spanned {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let _in = this.span.enter();
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Writes who is asking on the current request span.
pub fn tenant(id: &str) {
    Span::current().record(genai::TENANT, id);
}

/// The wall-clock time of `t` (an `Instant` in the past).
fn wall(t: Instant, now: (Instant, SystemTime)) -> SystemTime {
    now.1 - now.0.saturating_duration_since(t)
}

/// A choice ended: its queue, prefill and decode as child spans of the current request span, and its
/// usage and latencies on the request span.
pub fn choice_finished(model: &str, f: &Finished) {
    let span = Span::current();
    let t = f.timings;
    let now = (Instant::now(), SystemTime::now());
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    let u = f.usage;
    span.set_attribute(genai::REQUEST_MODEL, model.to_string());
    span.set_attribute(genai::RESPONSE_MODEL, model.to_string());
    span.set_attribute(genai::USAGE_INPUT_TOKENS, u.prompt_tokens as i64);
    span.set_attribute(genai::USAGE_OUTPUT_TOKENS, u.completion_tokens as i64);
    span.set_attribute(
        genai::RESPONSE_FINISH_REASONS,
        opentelemetry::Value::Array(vec![opentelemetry::StringValue::from(f.reason.as_str())].into()),
    );
    span.set_attribute(genai::LATENCY_E2E, secs(t.arrival, t.finished));
    let queued_until = t.first_scheduled.unwrap_or(t.finished);
    span.set_attribute(genai::LATENCY_TIME_IN_QUEUE, secs(t.arrival, queued_until));
    modelfleet_telemetry::past_span(
        &span,
        "queue",
        wall(t.arrival, now),
        wall(queued_until, now),
        vec![],
    );
    let Some(scheduled) = t.first_scheduled else {
        return;
    };
    let first = t.first_token.unwrap_or(t.finished);
    span.set_attribute(genai::LATENCY_TIME_IN_MODEL_PREFILL, secs(scheduled, first));
    modelfleet_telemetry::past_span(
        &span,
        "prefill",
        wall(scheduled, now),
        wall(first, now),
        vec![
            KeyValue::new(genai::USAGE_INPUT_TOKENS, u.prompt_tokens as i64),
            KeyValue::new("modelfleet.cached_tokens", u.cached_tokens as i64),
            KeyValue::new("modelfleet.prefill_steps", i64::from(t.prefill_steps)),
            KeyValue::new("modelfleet.preemptions", i64::from(t.preemptions)),
        ],
    );
    let Some(first) = t.first_token else {
        return;
    };
    span.set_attribute(genai::LATENCY_TIME_TO_FIRST_TOKEN, secs(t.arrival, first));
    span.set_attribute(genai::LATENCY_TIME_IN_MODEL_DECODE, secs(first, t.finished));
    modelfleet_telemetry::past_span(
        &span,
        "decode",
        wall(first, now),
        wall(t.finished, now),
        vec![
            KeyValue::new(genai::USAGE_OUTPUT_TOKENS, u.completion_tokens as i64),
            KeyValue::new("modelfleet.finish_reason", f.reason.as_str()),
        ],
    );
}
