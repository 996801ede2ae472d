//! The scheduler role: binds pending pods to this node, as kube-scheduler would on a one-node
//! cluster.
//!
//! A pod is bound when it has no `spec.nodeName`, its `schedulerName` is `default-scheduler` (or
//! empty), it has no scheduling gates, is not being deleted, is not terminal, and its `nodeSelector`
//! (if any) matches this node's labels. Affinity, taints and resources are not considered.
//!
//! Invariants: binding goes through the `pods/{name}/binding` subresource (so the API server sets
//! PodScheduled); a 409 means someone else bound it first; transient errors are retried a few times.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use super::context::Ctx;

/// Runs until `shutdown`.
pub async fn run(ctx: Arc<Ctx>, node_labels: BTreeMap<String, String>, shutdown: CancellationToken) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields("spec.nodeName=");
    let stream = watcher(api, config).default_backoff().applied_objects();
    let mut stream = std::pin::pin!(stream);
    loop {
        let pod = tokio::select! {
            _ = shutdown.cancelled() => return,
            next = stream.next() => match next {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "pending-pod watch failed; retrying");
                    continue;
                }
                Some(Ok(pod)) => pod,
            },
        };
        if schedulable(&pod, &node_labels) {
            tokio::spawn(bind(ctx.clone(), pod));
        }
    }
}

/// Whether this kubelet should bind `pod` to its node.
pub fn schedulable(pod: &Pod, node_labels: &BTreeMap<String, String>) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let unbound = spec.node_name.as_deref().is_none_or(str::is_empty);
    let ours = matches!(
        spec.scheduler_name.as_deref(),
        None | Some("") | Some("default-scheduler")
    );
    let gated = spec.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty());
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let terminal = matches!(phase, Some("Succeeded") | Some("Failed"));
    let selected = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node_labels.get(k) == Some(v));
    unbound && ours && !gated && !deleting && !terminal && selected
}

async fn bind(ctx: Arc<Ctx>, pod: Pod) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let node = ctx.config.node_name.clone();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.clone()),
            ..Default::default()
        },
    };
    for attempt in 0..5u32 {
        let result: Result<serde_json::Value, kube::Error> = api
            .create_subresource("binding", &name, &PostParams::default(), &binding)
            .await;
        match result {
            Ok(_) => {
                tracing::info!(pod = %format!("{ns}/{name}"), node = %node, "bound");
                ctx.events.normal(
                    &pod,
                    "Scheduled",
                    format!("Successfully assigned {ns}/{name} to {node}"),
                );
                return;
            }
            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => return,
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, attempt, "binding failed");
                tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pod: serde_json::Value, expected: bool) {
        let pod: Pod = serde_json::from_value(pod.clone()).unwrap();
        let labels = BTreeMap::from([("kubernetes.io/hostname".to_string(), "mf-node-0".to_string())]);
        assert_eq!(schedulable(&pod, &labels), expected, "{pod:?}");
    }

    #[test]
    fn only_unbound_default_scheduled_pods_are_bound() {
        use serde_json::json;
        let c = json!([{"name": "c"}]);
        check(
            json!({"metadata": {"name": "p"}, "spec": {"containers": c}}),
            true,
        );
        check(
            json!({"metadata": {"name": "p"}, "spec": {"containers": c, "schedulerName": "default-scheduler"}}),
            true,
        );
        check(
            json!({"metadata": {"name": "p"}, "spec": {"containers": c, "schedulerName": "other"}}),
            false,
        );
        check(
            json!({"metadata": {"name": "p"}, "spec": {"containers": c, "nodeName": "n"}}),
            false,
        );
        check(
            json!({"metadata": {"name": "p"}, "spec": {"containers": c, "schedulingGates": [{"name": "g"}]}}),
            false,
        );
        check(
            json!({"metadata": {"name": "p", "deletionTimestamp": "2025-01-01T00:00:00Z"}, "spec": {"containers": c}}),
            false,
        );
        check(
            json!({"metadata": {"name": "p"}, "spec": {"containers": c}, "status": {"phase": "Failed"}}),
            false,
        );
        check(
            json!({"metadata": {"name": "p"}, "spec": {"containers": c, "nodeSelector": {"kubernetes.io/hostname": "mf-node-0"}}}),
            true,
        );
        check(
            json!({"metadata": {"name": "p"}, "spec": {"containers": c, "nodeSelector": {"gpu": "yes"}}}),
            false,
        );
    }
}
