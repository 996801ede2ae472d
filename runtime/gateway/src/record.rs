//! One request's accounting: `modelfleet_gateway_requests_total` and one structured log line, written
//! exactly once however the request ends — answered, failed mid-stream, or dropped by its client
//! (`cancelled`, from `Drop`).
//!
//! Invariants: the log line carries deployment, tenant, pod, outcome, status and duration — never a
//! key, a prompt or a body.

use crate::metrics::Metrics;
use std::sync::Arc;
use std::time::Instant;

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
    done: bool,
}

impl Record {
    /// A request that arrived at `arrival`.
    pub fn new(metrics: Arc<Metrics>, arrival: Instant) -> Record {
        Record {
            metrics,
            arrival,
            namespace: String::new(),
            deployment: String::new(),
            tenant: String::new(),
            pod: String::new(),
            attempts: 0,
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
        tracing::info!(
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
