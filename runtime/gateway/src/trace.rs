//! The gateway's part of a request's trace (docs/operations.md, "Traces").
//!
//! One SERVER span per request (`POST /v1/chat/completions`…), a child of the caller's `traceparent`
//! when it sends one, carrying the model, the deployment, the tenant id (never the key) and the
//! outcome; under it a `limits` span (the tenant-limits store), a `wait_for_replica` span while a
//! deployment has no Ready pod (scale from zero), and one CLIENT span per attempt on a pod
//! (`attempt`: the pod, its revision, why it was chosen, why the previous attempt was given up). The
//! attempt's context goes to the pod in `traceparent`, so the runtime's span is its child.
//!
//! Invariant: the request span lives as long as the request's [`crate::record::Record`] — to the end
//! of a streamed body, or the client's disconnect.

use axum::http::HeaderMap;
use modelfleet_telemetry::genai;
use modelfleet_telemetry::propagation;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The request's span, joined to the caller's trace, and its trace id (for the log lines; empty if
/// neither the gateway traces nor the caller sent a context).
pub fn request_span(method: &str, path: &str, headers: &HeaderMap) -> (Span, String) {
    let remote = propagation::extract(headers);
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{method} {path}"),
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = %method,
        http.route = %path,
        http.response.status_code = Empty,
        { genai::REQUEST_MODEL } = Empty,
        { genai::TENANT } = Empty,
        modelfleet.deployment = Empty,
        { genai::POD } = Empty,
        modelfleet.attempts = Empty,
        modelfleet.outcome = Empty,
        trace_id = Empty,
    );
    // Before the span is first entered (afterwards the parent cannot change).
    let _ = span.set_parent(remote.clone());
    let trace_id = modelfleet_telemetry::trace_id(&span, &remote).unwrap_or_default();
    if !trace_id.is_empty() {
        span.record("trace_id", trace_id.as_str());
    }
    (span, trace_id)
}

/// An attempt on a pod: a CLIENT span under the request's.
pub fn attempt_span(attempt: u32, pod: &str, revision: &str, reason: &str, previous: Option<&str>) -> Span {
    tracing::info_span!(
        "attempt",
        otel.kind = "client",
        otel.status_code = Empty,
        { genai::ATTEMPT } = attempt,
        { genai::POD } = %pod,
        { genai::REVISION } = %revision,
        { genai::ROUTE_REASON } = %reason,
        { genai::RETRY_REASON } = previous.unwrap_or(""),
        http.response.status_code = Empty,
        modelfleet.outcome = Empty,
    )
}

/// The headers to send to a pod: `headers` with the attempt's trace context (a caller's own
/// `traceparent` passes through unchanged when the gateway does not trace).
pub fn to_pod(headers: &HeaderMap, attempt: &Span) -> HeaderMap {
    let mut out = headers.clone();
    propagation::inject(&attempt.context(), &mut out);
    out
}

/// Marks `span` as failed (an error status; the outcome says why).
pub fn failed(span: &Span, outcome: &str) {
    span.record("otel.status_code", "error");
    span.record("modelfleet.outcome", outcome);
}

/// A fallback moved the request (`reason`) to deployment `target` (`namespace/name`): an event on the
/// request's span, whose deployment becomes the target; the attempts there follow as its children.
pub fn moved(request: &Span, reason: &str, target: &str) {
    use opentelemetry::KeyValue;
    request.add_event(
        "fallback",
        vec![
            KeyValue::new("modelfleet.fallback.reason", reason.to_string()),
            KeyValue::new("modelfleet.fallback.target", target.to_string()),
        ],
    );
    request.record("modelfleet.deployment", target);
}
