//! The worker's status reporting: build the pod status from its containers and patch it on the
//! `status` subresource when, and only when, it changed.
//!
//! The patch is a JSON merge patch of the fields the kubelet owns (phase, conditions, IPs, start
//! time, container statuses, observedGeneration); conditions owned by others are carried in it
//! unchanged. Invariants: the last successfully sent patch is remembered and an identical one is
//! never sent (no write storms); timestamps are whole seconds and only change on transitions; a
//! failed write is retried after a short delay (a status rejected as invalid is not resent).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::container::Kind;
use super::status::{self, PodFacts, RestartPolicy};
use super::{PodWorker, process};

/// What the worker remembers about its status writes.
#[derive(Debug, Default)]
pub struct Reporter {
    /// The status fields last written.
    last_sent: Option<Value>,
    /// Conditions as last computed (transition times live here).
    conditions: Vec<PodCondition>,
    /// `status.startTime`.
    start_time: Option<Time>,
    /// Retry a failed write at this time.
    retry_at: Option<Instant>,
    /// The phase became terminal and is latched.
    terminal_phase: Option<String>,
}

impl Reporter {
    /// Starts from what the API shows (conditions and start time survive a kubelet restart).
    pub fn from_pod(pod: &Pod) -> Self {
        let status = pod.status.clone().unwrap_or_default();
        Reporter {
            conditions: status.conditions.unwrap_or_default(),
            start_time: status.start_time,
            ..Default::default()
        }
    }

    /// The sandbox is up: the pod has started.
    pub fn start_sandbox(&mut self) {
        if self.start_time.is_none() {
            self.start_time = Some(Time(process::now()));
        }
    }

    /// When a failed write should be retried.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }
}

impl PodWorker {
    /// Computes the status; patches it if it differs from the last write.
    pub(super) async fn report(&mut self) {
        if self.frozen {
            return;
        }
        let value = self.build_status();
        if self.report.last_sent.as_ref() == Some(&value) {
            return;
        }
        let ns = self.pod.metadata.namespace.clone().unwrap_or_default();
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &ns);
        let patch = json!({ "status": value });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                self.report.last_sent = Some(value);
                self.report.retry_at = None;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                self.report.retry_at = None;
            }
            Err(kube::Error::Api(s)) if s.code == 422 => {
                // Invalid: sending the same status again cannot help; wait for the next change.
                tracing::error!(pod = %format!("{ns}/{name}"), error = %s.message, "status rejected as invalid");
                self.report.last_sent = Some(value);
                self.report.retry_at = None;
            }
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "status update failed; retrying");
                self.report.retry_at = Some(Instant::now() + Duration::from_secs(2));
            }
        }
    }

    /// The status fields the kubelet owns, as JSON.
    fn build_status(&mut self) -> Value {
        let init: Vec<_> = self.init.iter().map(|c| c.status()).collect();
        let sidecar: Vec<bool> = self.init.iter().map(|c| c.kind == Kind::Sidecar).collect();
        let containers: Vec<_> = self.main.iter().map(|c| c.status()).collect();
        let spec = self.pod.spec.as_ref();
        let facts = PodFacts {
            restart_policy: RestartPolicy::parse(spec.and_then(|s| s.restart_policy.as_deref())),
            init: &init,
            sidecar: &sidecar,
            containers: &containers,
            sandbox_ready: self.sandbox.ready,
            terminal: self.stopped,
            initialized_once: self.main.iter().any(|c| c.ever_started),
        };
        let phase = match &self.report.terminal_phase {
            Some(p) => p.clone(),
            None => status::phase(&facts).to_string(),
        };
        if status::is_terminal(&phase) {
            self.report.terminal_phase = Some(phase.clone());
            self.terminal = true;
        }
        let now = Time(process::now());
        self.report.conditions = status::conditions(&facts, &phase, &self.report.conditions, &now);
        let host_ip = self.ctx.config.node_ip.to_string();
        let mut value = json!({
            "phase": phase,
            "conditions": self.report.conditions,
            "hostIP": host_ip,
            "hostIPs": [{ "ip": host_ip }],
            "initContainerStatuses": init,
            "containerStatuses": containers,
        });
        if let Some(start) = &self.report.start_time {
            value["startTime"] = json!(start);
        }
        if !self.pod_ip.is_empty() {
            value["podIP"] = json!(self.pod_ip);
            value["podIPs"] = json!([{ "ip": self.pod_ip }]);
        }
        if let Some(generation) = self.pod.metadata.generation {
            value["observedGeneration"] = json!(generation);
        }
        value
    }
}
