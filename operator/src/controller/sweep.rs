//! The adapter sweep: a runtime pod serves only adapters that a LoraAdapter of its ModelDeployment lists.
//! An adapter whose LoraAdapter was deleted while its unload could not be done (the pod was unreachable
//! and the finalizer gave up), or one loaded by hand through the admin API, is unloaded here.
//!
//! Each ModelDeployment pass starts one sweep task (none while the previous one runs): it asks every
//! ready pod what it serves (`GET /v1/adapters`), then lists the deployment's LoraAdapters, and unloads
//! every name none of them serves. The list is the same one the start-up ConfigMap is built from, read
//! after the pods answered, so an adapter loaded while the sweep ran (its LoraAdapter created before
//! the load) is always kept. Deleting LoraAdapters are not kept.
//!
//! Invariant: no reconcile pass waits on a pod — the sweep is a task with per-call timeouts; at most one
//! runs per ModelDeployment.

use crate::lora::admin::{self, AdminToken};
use crate::lora::desired;
use crate::telemetry::Metrics;
use kube::api::{Api, ListParams};
use modelfleet_crds::LoraAdapter;
use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest a pod's adapter list may take.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest one unload may take.
pub const UNLOAD_TIMEOUT: Duration = Duration::from_secs(15);

/// Starts sweeps; remembers which ModelDeployments have one running.
#[derive(Clone)]
pub struct Sweeper {
    /// Client for the admin API (timeouts are per call).
    pub http: reqwest::Client,
    /// Port of the pods' admin API ([`crate::labels::ADMIN_PORT`]; tests point it at a fake).
    pub admin_port: i32,
    /// `ns/name` of ModelDeployments with a sweep running.
    pub running: Arc<Mutex<HashSet<String>>>,
}

impl Sweeper {
    /// A sweeper for the pods' admin port.
    pub fn new(http: reqwest::Client) -> Sweeper {
        Sweeper {
            http,
            admin_port: crate::labels::ADMIN_PORT,
            running: Default::default(),
        }
    }
}

/// The served names the LoraAdapters of ModelDeployment `md` in `ns` keep: those not being deleted.
pub fn kept_names(adapters: &[LoraAdapter], ns: &str, md: &str) -> BTreeSet<String> {
    adapters
        .iter()
        .filter(|a| desired::references(a, ns, md) && a.metadata.deletion_timestamp.is_none())
        .map(desired::served_name)
        .collect()
}

/// One pod to sweep: its name and IP.
#[derive(Clone, Debug)]
pub struct Target {
    /// Pod name (for logs).
    pub pod: String,
    /// Pod IP.
    pub ip: String,
}

/// Starts a sweep of `targets` (ready pods of `md` in `ns`) unless one runs for `md`.
pub fn start(
    sweeper: &Sweeper,
    client: kube::Client,
    metrics: Arc<Metrics>,
    ns: String,
    md: String,
    targets: Vec<Target>,
    token: String,
) {
    if targets.is_empty() {
        return;
    }
    let key = format!("{ns}/{md}");
    if !sweeper.running.lock().unwrap().insert(key.clone()) {
        return;
    }
    let sweeper = sweeper.clone();
    tokio::spawn(async move {
        let token = AdminToken::new(token);
        let unloaded = sweep(&sweeper, &client, &metrics, &ns, &md, &targets, &token).await;
        if let Err(e) = unloaded {
            tracing::debug!(namespace = %ns, model_deployment = %md, error = %e, "adapter sweep stopped");
        }
        sweeper.running.lock().unwrap().remove(&key);
    });
}

/// One sweep; returns the (pod, served name) pairs it unloaded.
pub async fn sweep(
    sweeper: &Sweeper,
    client: &kube::Client,
    metrics: &Metrics,
    ns: &str,
    md: &str,
    targets: &[Target],
    token: &AdminToken,
) -> Result<Vec<(String, String)>, kube::Error> {
    let http = &sweeper.http;
    let mut served = Vec::new();
    for t in targets {
        let base = admin::base_url(&t.ip, sweeper.admin_port);
        match admin::list(http, &base, token, LIST_TIMEOUT).await {
            Ok(names) => served.push((t, base, names)),
            Err(e) => tracing::debug!(pod = %t.pod, error = %e.message, "adapter sweep: listing failed"),
        }
    }
    // Read after the pods answered: an adapter they serve whose LoraAdapter existed then is listed here.
    let adapters = Api::<LoraAdapter>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items;
    let keep = kept_names(&adapters, ns, md);
    let mut unloaded = Vec::new();
    for (t, base, names) in served {
        for name in names.into_iter().filter(|n| !keep.contains(n)) {
            let result = admin::unload(http, &base, token, &name, UNLOAD_TIMEOUT).await;
            let label = match &result {
                Ok(()) => "ok",
                Err(e) => e.reason.as_str(),
            };
            metrics.adapter_calls.with_label_values(&["sweep", label]).inc();
            match result {
                Ok(()) => {
                    tracing::info!(namespace = %ns, model_deployment = %md, pod = %t.pod, adapter = %name,
                        "unloaded an adapter no LoraAdapter lists");
                    unloaded.push((t.pod.clone(), name));
                }
                Err(e) => tracing::info!(pod = %t.pod, adapter = %name, error = %e.message,
                    "adapter sweep: unload failed; the next pass tries again"),
            }
        }
    }
    Ok(unloaded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::fake::{FakeAdmin, TOKEN};
    use crate::testing::{expect, ok};
    use http::{Method, Request, Response};
    use kube::client::Body;
    use serde_json::json;

    fn adapter(name: &str, md: &str, deleting: bool) -> serde_json::Value {
        let mut meta = json!({"name": name, "namespace": "serving", "uid": format!("uid-{name}"), "generation": 1,
                              "creationTimestamp": "2027-01-15T08:00:00Z"});
        if deleting {
            meta["deletionTimestamp"] = json!("2027-01-15T09:00:00Z");
            meta["finalizers"] = json!(["modelfleet.io/lora-unload"]);
        }
        json!({"apiVersion": "modelfleet.io/v1alpha1", "kind": "LoraAdapter", "metadata": meta,
               "spec": {"modelDeploymentRef": {"name": md}, "uri": format!("file:///a/{name}"),
                        "digest": format!("sha256:{}", "1".repeat(64))}})
    }

    #[tokio::test]
    async fn pods_drop_adapters_no_lora_adapter_lists() {
        let fake = FakeAdmin::start().await;
        for name in ["kept", "deleted-meanwhile", "by-hand", "deleting"] {
            fake.state
                .lock()
                .unwrap()
                .loaded
                .insert(name.into(), json!({"name": name}));
        }
        let port: i32 = fake.base.rsplit(':').next().unwrap().parse().unwrap();
        let sweeper = Sweeper {
            admin_port: port,
            ..Sweeper::new(crate::autoscaler::metrics::http_client())
        };
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "serving");
        let api = tokio::spawn(async move {
            let list = json!({"apiVersion": "modelfleet.io/v1alpha1", "kind": "LoraAdapterList", "metadata": {},
                "items": [adapter("kept", "smollm2", false), adapter("deleting", "smollm2", true),
                          adapter("by-hand", "another-model", false)]});
            expect(
                &mut handle,
                Method::GET,
                "/apis/modelfleet.io/v1alpha1/namespaces/serving/loraadapters",
                |_| ok(&list),
            )
            .await;
        });
        let targets = [Target {
            pod: "smollm2-0".into(),
            ip: "127.0.0.1".into(),
        }];
        let metrics = Metrics::default();
        let token = AdminToken::new(TOKEN.into());
        let mut unloaded = sweep(
            &sweeper, &client, &metrics, "serving", "smollm2", &targets, &token,
        )
        .await
        .unwrap();
        api.await.unwrap();
        unloaded.sort();
        let pod = |n: &str| ("smollm2-0".to_string(), n.to_string());
        assert_eq!(
            unloaded,
            [pod("by-hand"), pod("deleted-meanwhile"), pod("deleting")],
            "an adapter of another deployment with the same name does not keep it here"
        );
        let left: Vec<String> = fake.state.lock().unwrap().loaded.keys().cloned().collect();
        assert_eq!(left, ["kept"]);
    }
}
