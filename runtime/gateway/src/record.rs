//! One request's accounting: `modelfleet_gateway_requests_total` and one structured log line, written
//! exactly once however the request ends — answered, failed mid-stream, or dropped by its client
//! (`cancelled`, from `Drop`).
//!
//! Invariants: the log line carries deployment, tenant, pod, outcome, status, duration and the trace
//! id — never a key, a prompt or a body. The request's span ([`crate::trace`]) lives as long as the
//! record and ends with it, its outcome written by `finish`.

use crate::metrics::Metrics;
use std::sync::Arc;
use std::time::Instant;
use tracing::Span;

/// The request being accounted for.
pub struct Record {
    metrics: Arc<Metrics>,
    arrival: Instant,
    /// Namespace of the deployment (empty before `model` is known).
    pub namespace: String,
    /// The deployment's name (empty before `model` is known).
    pub deployment: String,
    /// The tenant id (empty before authentication).
    pub tenant: String,
    /// The pod that served, if one did.
    pub pod: String,
    /// Attempts on pods so far.
    pub attempts: u32,
    /// The request's span.
    pub span: Span,
    /// Its trace id (empty: not traced).
    pub trace_id: String,
    done: bool,
}

impl Record {
    /// A request that arrived at `arrival`.
    pub fn new(metrics: Arc<Metrics>, arrival: Instant, span: Span, trace_id: String) -> Record {
        Record {
            metrics,
            arrival,
            namespace: String::new(),
            deployment: String::new(),
            tenant: String::new(),
            pod: String::new(),
            attempts: 0,
            span,
            trace_id,
            done: false,
        }
    }

    /// Writes the outcome (`ok`, `stream_error`, `cancelled`, or an HTTP status) once.
    pub fn finish(&mut self, outcome: &str) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        self.metrics
            .requests
            .with_label_values(&[
                &self.namespace,
                &self.deployment,
                &self.tenant,
                outcome,
                &self.pod,
            ])
            .inc();
        let span = &self.span;
        span.record("modelfleet.outcome", outcome);
        span.record("modelfleet.attempts", self.attempts);
        span.record(modelfleet_telemetry::genai::POD, self.pod.as_str());
        if let Ok(code) = outcome.parse::<u16>() {
            span.record("http.response.status_code", code);
        }
        if outcome != "ok" {
            span.record("otel.status_code", "error");
        }
        tracing::info!(
            trace_id = %self.trace_id,
            namespace = %self.namespace,
            model_deployment = %self.deployment,
            tenant = %self.tenant,
            pod = %self.pod,
            attempts = self.attempts,
            outcome,
            ms = self.arrival.elapsed().as_millis() as u64,
            "request"
        );
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.finish("cancelled");
    }
}
