//! modelfleet-operator: turns each `ModelDeployment` into a serving fleet and keeps it right.
//!
//! A tour, in the order a reconcile pass runs:
//! - [`controller`]: the thin `reconcile` — observe, decide replicas ([`autoscaler`]), apply the desired
//!   objects ([`builders`], pure functions) with server-side apply under one field manager, then write
//!   the status ([`status`], a pure function of what was observed) only when it changed.
//! - [`autoscaler`]: queue depth and KV-cache pressure in, a replica count out; its decision lives in
//!   `status.desiredReplicas`, never in the user's spec.
//! - [`capacity`]: with `spec.cost`, output tokens per replica (observed and at saturation) and the cost
//!   per million output tokens, measured from the replicas' counters into `status.capacity`.
//! - [`lora`]: the LoraAdapter controller — loads adapters onto ready pods through the runtime's admin
//!   API (calls run as tasks, off the reconcile path), per-pod state in status, unload on deletion.
//! - [`leader`]: leader election on a `Lease`, so two replicas can run and one fails over.
//! - [`pod_metrics`]: reading the runtime pods' metrics (their `/metrics`, or Prometheus), for the
//!   autoscaler and the capacity measurement alike.
//! - [`external_metrics`]: `external.metrics.k8s.io` for HorizontalPodAutoscalers of deployments in
//!   `External` mode (the fleet's queue and KV figures, read fresh from the pods).
//! - [`telemetry`]: `/metrics`, `/healthz`, `/readyz` and the operator's own Prometheus metrics.
//!
//! Invariants: nothing but the reconciler's one server-side apply writes the runtime Deployment (so its
//! replicas never have two writers) and the adapters ConfigMap; the operator never adopts an object it
//! did not create (`NameConflict`) and never patches a Secret; status contains nothing that changes
//! without a change in the world; no reconcile pass waits on a runtime pod's admin API; every answer
//! read from a pod or Prometheus is capped in bytes and time ([`body`]).

pub mod autoscaler;
pub mod body;
pub mod builders;
pub mod capacity;
pub mod config;
pub mod controller;
pub mod external_metrics;
pub mod labels;
pub mod leader;
pub mod lora;
pub mod pod_metrics;
pub mod restarts;
pub mod rollout;
pub mod scope;
pub mod started;
pub mod starting;
pub mod status;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod testing;

/// Errors of a reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The object lacks something the API server always sets (name, namespace).
    #[error("invalid object: {0}")]
    Invalid(String),
}

impl Error {
    /// A stable label for metrics (`modelfleet_operator_reconcile_errors_total{reason}`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api_error",
            Error::Kube(_) => "client_error",
            Error::Invalid(_) => "invalid_object",
        }
    }
}
