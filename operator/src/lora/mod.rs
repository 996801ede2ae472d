//! The LoraAdapter controller: loads each adapter onto every ready pod of its ModelDeployment through
//! the runtime's admin API, reports per-pod state and `Verified`/`Ready` in status, and unloads it on
//! deletion (finalizer).
//!
//! Modules, in the order a pass uses them:
//! - [`reconcile`]: the thin pass — finalizer step, observe through the API, ask for calls, write status.
//! - [`desired`]: pure — served names, who owns a name (conflicts), the start-up list, target pods.
//! - [`ops`]: admin calls as tasks with timeouts, per-pod limits and back-off; outcomes in memory.
//! - [`admin`]: the HTTP calls and the error-code → condition-reason mapping.
//! - [`status`]: pure — status from what was observed; [`events`]: Events on transitions;
//!   [`finalizer`]: the unload finalizer.
//!
//! Triggers: the adapter itself (spec, finalizers, deletion — not our status writes), runtime Pods of its
//! deployment (a pod turning ready or restarting gets the adapter), the ModelDeployment (created or
//! deleted later than the adapter), and the end of each admin call. The start-up list that new pods load
//! before they turn ready is written by the ModelDeployment controller (`<md>-adapters`, one writer),
//! from [`desired::startup_entries`].

pub mod admin;
pub mod desired;
pub mod events;
pub mod finalizer;
pub mod ops;
pub mod reconcile;
pub mod status;

#[cfg(test)]
pub(crate) mod fake;

use crate::Error;
use crate::labels::{APP_NAME, MODEL_DEPLOYMENT_LABEL};
use crate::scope::{self, Scope};
use crate::telemetry::Metrics;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::Predicate;
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, ResourceExt};
use modelfleet_crds::{LoraAdapter, ModelDeployment};
use ops::{Ops, Runner};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Shared state of the LoraAdapter passes.
pub struct Context {
    /// The API client (the operator's ServiceAccount).
    pub client: Client,
    /// Starts admin calls and holds their outcomes.
    pub runner: Runner,
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
    /// Publishes Events on LoraAdapters.
    pub recorder: Recorder,
    /// Consecutive failed passes per adapter (`ns/name`), for the error back-off.
    pub failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    fn key(a: &LoraAdapter) -> String {
        format!("{}/{}", a.namespace().unwrap_or_default(), a.name_any())
    }

    /// A pass succeeded: the next failure backs off from the start again.
    pub fn succeeded(&self, a: &LoraAdapter) {
        self.failures.lock().unwrap().remove(&Self::key(a));
    }

    /// A pass failed: how long to wait before the next (1 s doubling to 5 min).
    pub fn failed(&self, a: &LoraAdapter) -> Duration {
        let mut failures = self.failures.lock().unwrap();
        let n = failures.entry(Self::key(a)).or_insert(0);
        *n = n.saturating_add(1);
        error_backoff(*n)
    }
}

/// Wait before retrying after the `n`th consecutive failed pass.
pub fn error_backoff(n: u32) -> Duration {
    (Duration::from_secs(1) * (1u32 << n.saturating_sub(1).min(16))).min(Duration::from_secs(300))
}

/// The adapters of ModelDeployment `md` in `ns`, from the controller's cache.
fn adapters_of(store: &Store<LoraAdapter>, ns: &str, md: &str) -> Vec<ObjectRef<LoraAdapter>> {
    store
        .state()
        .iter()
        .filter(|a| desired::references(a, ns, md))
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

fn error_policy(a: Arc<LoraAdapter>, error: &Error, ctx: Arc<Context>) -> Action {
    let wait = ctx.failed(&a);
    tracing::warn!(namespace = ?a.namespace(), name = %a.name_any(), %error, ?wait, "LoraAdapter reconcile failed");
    ctx.metrics
        .errors
        .with_label_values(&[error.metric_label()])
        .inc();
    Action::requeue(wait)
}

/// Runs the LoraAdapter controller until a shutdown signal, with one set of watches per partition of
/// `scope`; the ends of admin calls are routed to the partition of their adapter.
pub async fn run(client: Client, metrics: Arc<Metrics>, identity: &str, scope: &Scope) {
    let (wake, mut woken) = futures::channel::mpsc::unbounded::<ObjectRef<LoraAdapter>>();
    let reporter = Reporter {
        controller: "modelfleet-operator".into(),
        instance: Some(identity.into()),
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        runner: Runner {
            http: admin::http_client(),
            ops: Arc::new(Mutex::new(Ops::default())),
            wake,
            timeouts: admin::Timeouts::default(),
            metrics: metrics.clone(),
            admin_port: crate::labels::ADMIN_PORT,
        },
        metrics,
        recorder: Recorder::new(client.clone(), reporter),
        failures: Mutex::new(HashMap::new()),
    });
    let partitions = scope.partitions();
    let mut routes = HashMap::new();
    let mut runs = Vec::new();
    for partition in partitions {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        routes.insert(partition.clone(), tx);
        runs.push(run_in(client.clone(), ctx.clone(), partition, rx));
    }
    let cluster_wide = routes.contains_key(&None);
    tokio::spawn(async move {
        while let Some(adapter) = woken.next().await {
            let key = if cluster_wide {
                None
            } else {
                adapter.namespace.clone()
            };
            if let Some(tx) = routes.get(&key) {
                let _ = tx.unbounded_send(adapter);
            }
        }
    });
    futures::future::join_all(runs).await;
}

/// The controller over one partition of the scope (every namespace, or one).
async fn run_in(
    client: Client,
    ctx: Arc<Context>,
    partition: Option<String>,
    woken: futures::channel::mpsc::UnboundedReceiver<ObjectRef<LoraAdapter>>,
) {
    let (reader, writer) = reflector::store();
    // Spec changes, finalizer changes and deletion (which bumps the generation) — not status writes.
    let trigger = watcher(
        scope::api::<LoraAdapter>(client.clone(), &partition),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .reflect(writer)
    .applied_objects()
    .predicate_filter(
        predicates::generation.combine(predicates::finalizers),
        Default::default(),
    );
    let pods_cfg = watcher::Config::default().labels(&format!("app.kubernetes.io/name={APP_NAME}"));
    let by_pod = reader.clone();
    let by_md = reader.clone();
    Controller::for_stream(trigger, reader)
        .with_config(Config::default().debounce(Duration::from_millis(500)))
        .watches(
            scope::api::<Pod>(client.clone(), &partition),
            pods_cfg,
            move |pod: Pod| {
                let (Some(ns), Some(md)) = (pod.namespace(), pod.labels().get(MODEL_DEPLOYMENT_LABEL)) else {
                    return Vec::new();
                };
                adapters_of(&by_pod, &ns, md)
            },
        )
        .watches(
            scope::api::<ModelDeployment>(client, &partition),
            watcher::Config::default(),
            move |md: ModelDeployment| {
                adapters_of(&by_md, &md.namespace().unwrap_or_default(), &md.name_any())
            },
        )
        .reconcile_on(woken)
        .shutdown_on_signal()
        .run(reconcile::reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "LoraAdapter reconcile trigger failed");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_backoff_doubles_to_five_minutes() {
        let got: Vec<u64> = [1, 2, 3, 9, 10, 100]
            .iter()
            .map(|&n| error_backoff(n).as_secs())
            .collect();
        assert_eq!(got, [1, 2, 4, 256, 300, 300]);
    }
}
