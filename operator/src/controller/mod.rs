//! The ModelDeployment controller: a thin `reconcile` that observes, decides the replica count, applies
//! the desired objects with server-side apply, and writes status only when it changed.
//!
//! Watches: ModelDeployments (spec changes only — the generation predicate drops our own status writes),
//! the Deployments they own, runtime Pods (init-container verdicts, readiness), and LoraAdapters (their
//! start-up list, the `<md>-adapters` ConfigMap, is written here). Builtin-autoscaled deployments are
//! also requeued every few seconds so metrics are read on a steady cadence, the others every minute
//! (each pass also starts the adapter sweep, [`sweep`]).
//!
//! A pass applies nothing when a same-named object is not this ModelDeployment's ([`ownership`]):
//! status then says `Stalled`/`NameConflict`, and the pass comes back every 30 s. Two deployments
//! claiming one served name both get `ServedNameConflict` ([`served_names`], seen across partitions
//! through [`peers`]); the pass looks again every 10 s until it clears.

mod apply;
pub(crate) mod events;
pub mod ownership;
pub mod peers;
mod scale;
mod served_names;
pub mod sweep;
mod zero;

pub(crate) use scale::is_ready;

use crate::Error;
use crate::builders;
use crate::config::OperatorConfig;
use crate::labels::{APP_NAME, MODEL_DEPLOYMENT_LABEL, selector_string};
use crate::scope::{self, Scope};
use crate::status::{Observed, TenantsSecret, carry_transition_times, conditions};
use crate::telemetry::Metrics;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, ResourceExt};
use modelfleet_crds::model_deployment::{AutoscalingMode, ModelDeploymentStatus};
use modelfleet_crds::{LoraAdapter, ModelDeployment};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Shared state of all reconcile passes.
pub struct Context {
    /// The API client (the operator's ServiceAccount).
    pub client: Client,
    /// Operator-wide settings.
    pub cfg: OperatorConfig,
    /// HTTP client for pod scrapes and Prometheus.
    pub http: reqwest::Client,
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
    /// Publishes Events on ModelDeployments.
    pub recorder: Recorder,
    /// Per ModelDeployment: when its metrics were last read (the autoscaler's rate limit) and the
    /// stabilization windows (authoritative while this replica leads).
    pub last_sample: Mutex<HashMap<String, scale::Memory>>,
    /// Starts the adapter sweeps.
    pub sweeper: sweep::Sweeper,
    /// Every ModelDeployment and LoraAdapter in scope (served-name conflicts).
    pub peers: peers::Peers,
    /// Per ModelDeployment with `spec.cost`: the capacity samples of its window.
    pub capacity: Mutex<HashMap<String, crate::capacity::Memory>>,
}

/// How often the built-in autoscaler reads metrics.
pub const AUTOSCALE_INTERVAL: Duration = Duration::from_secs(3);
/// How often other ModelDeployments are passed over (and their pods swept) without a change.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(60);
/// How often a pass stopped by a `NameConflict` looks again.
pub const CONFLICT_RETRY: Duration = Duration::from_secs(30);
/// How often a deployment in a served-name conflict looks again (the peer going away announces
/// nothing to this deployment).
pub const CONFLICT_RECHECK: Duration = Duration::from_secs(10);

/// Runs the controller until a shutdown signal, with one set of watches per partition of `scope`.
pub async fn run(client: Client, cfg: OperatorConfig, metrics: Arc<Metrics>, identity: &str, scope: &Scope) {
    let http = crate::autoscaler::metrics::http_client();
    let reporter = Reporter {
        controller: "modelfleet-operator".into(),
        instance: Some(identity.into()),
    };
    let (peers, feeds) = peers::Peers::new(scope.partitions());
    let ctx = Arc::new(Context {
        client: client.clone(),
        cfg,
        http,
        metrics,
        recorder: Recorder::new(client.clone(), reporter),
        last_sample: Mutex::new(HashMap::new()),
        sweeper: sweep::Sweeper::new(crate::lora::admin::http_client()),
        peers,
        capacity: Mutex::new(HashMap::new()),
    });
    let runs = feeds
        .into_iter()
        .map(|feeds| run_in(client.clone(), ctx.clone(), feeds));
    futures::future::join_all(runs).await;
}

/// The controller over one partition of the scope (every namespace, or one).
async fn run_in(client: Client, ctx: Arc<Context>, feeds: peers::Feeds) {
    let partition = feeds.partition;
    let mds: Api<ModelDeployment> = scope::api(client.clone(), &partition);
    let trigger = watcher(mds, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(feeds.mds)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let adapters = watcher(
        scope::api::<LoraAdapter>(client.clone(), &partition),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(feeds.adapters)
    .touched_objects();
    let pods_cfg = watcher::Config::default().labels(&format!("app.kubernetes.io/name={APP_NAME}"));
    Controller::for_stream(trigger, feeds.mds_reader)
        .owns(
            scope::api::<Deployment>(client.clone(), &partition),
            watcher::Config::default(),
        )
        .watches(
            scope::api::<Pod>(client.clone(), &partition),
            pods_cfg,
            |pod: Pod| {
                let md = pod.labels().get(MODEL_DEPLOYMENT_LABEL)?.clone();
                Some(ObjectRef::<ModelDeployment>::new(&md).within(&pod.namespace()?))
            },
        )
        .watches_stream(adapters, |a: LoraAdapter| {
            let md = &a.spec.model_deployment_ref.name;
            Some(ObjectRef::<ModelDeployment>::new(md).within(&a.namespace()?))
        })
        .reconcile_on(feeds.woken)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile trigger failed");
            }
        })
        .await;
}

fn error_policy(md: Arc<ModelDeployment>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %md.name_any(), %error, "reconcile failed");
    ctx.metrics
        .errors
        .with_label_values(&[error.metric_label()])
        .inc();
    Action::requeue(Duration::from_secs(5))
}

async fn tenants_secret(secrets: &Api<Secret>, md: &ModelDeployment) -> Result<TenantsSecret, Error> {
    let Some(t) = &md.spec.tenants else {
        return Ok(TenantsSecret::NotReferenced);
    };
    let name = t.secret_ref.name.clone();
    Ok(match secrets.get_opt(&name).await? {
        None => TenantsSecret::Missing(name),
        Some(s) => {
            let key = &t.secret_ref.key;
            let in_data = s.data.as_ref().is_some_and(|m| m.contains_key(key));
            let in_string_data = s.string_data.as_ref().is_some_and(|m| m.contains_key(key));
            if in_data || in_string_data {
                TenantsSecret::Present
            } else {
                TenantsSecret::MissingKey(name, t.secret_ref.key.clone())
            }
        }
    })
}

/// One pass for one ModelDeployment.
pub async fn reconcile(md: Arc<ModelDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.duration.start_timer();
    ctx.metrics.reconciliations.inc();
    let ns = md
        .namespace()
        .ok_or_else(|| Error::Invalid("ModelDeployment without a namespace".into()))?;
    let name = md.name_any();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);

    // Observe.
    let owned = ownership::Existing::read(&ctx.client, &md).await?;
    let existing = owned.deployment.clone();
    let pods = pods_api
        .list(&ListParams::default().labels(&selector_string(&name)))
        .await?
        .items;
    let tenants = tenants_secret(&secrets, &md).await?;
    let adapters: Vec<LoraAdapter> = Api::<LoraAdapter>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|a| crate::lora::desired::references(a, &ns, &name))
        .collect();
    let startup = crate::lora::desired::startup_entries(&adapters, &builders::deployment::served_name(&md));

    // Apply nothing over an object this ModelDeployment does not control; else decide the replica
    // count, apply everything the operator owns, and sweep stray adapters off the ready pods.
    let conflict = ownership::conflict(&md, &owned);
    let clashes = ctx.peers.clashes(&md, ctx.cfg.served_name_scope);
    let (scaled, deployment) = if conflict.is_some() {
        (scale::unchanged(&md), None)
    } else {
        let scaled = scale::replicas(&md, existing.as_ref(), &pods, &ctx).await;
        let token = apply::owned_objects(&md, &ctx, &owned, scaled.replicas, &startup).await?;
        let targets = pods
            .iter()
            .filter(|p| scale::is_ready(p))
            .filter_map(|p| {
                Some(sweep::Target {
                    pod: p.name_any(),
                    ip: p.status.as_ref()?.pod_ip.clone()?,
                })
            })
            .collect();
        sweep::start(
            &ctx.sweeper,
            ctx.client.clone(),
            ctx.metrics.clone(),
            ns.clone(),
            name.clone(),
            targets,
            token,
        );
        (scaled, deployments.get_opt(&name).await?)
    };
    let capacity = match conflict {
        Some(_) => md.status.as_ref().and_then(|s| s.capacity.clone()),
        None => crate::capacity::observe(&md, &pods, &ctx).await,
    };

    // Status, from what was observed.
    let now = Timestamp::now();
    let previous = md.status.clone().unwrap_or_default();
    let observed = Observed {
        generation: md.metadata.generation.unwrap_or(0),
        digest: &md.spec.model.digest,
        desired: scaled.replicas,
        deployment: deployment.as_ref(),
        pods: &pods,
        tenants,
        scaling: scaled.scaling.clone(),
        conflict: conflict.clone(),
        served_name_conflict: served_names::message(&clashes),
        now,
        gpus_reserved: crate::status::gpus_reserved(
            md.spec.runtime.as_ref().and_then(|r| r.resources.as_ref()),
        ),
    };
    let dep_status = deployment
        .as_ref()
        .and_then(|d| d.status.clone())
        .unwrap_or_default();
    let status = ModelDeploymentStatus {
        observed_generation: md.metadata.generation,
        replicas: dep_status.replicas.unwrap_or(0),
        ready_replicas: dep_status.ready_replicas.unwrap_or(0),
        desired_replicas: Some(scaled.replicas),
        selector: Some(selector_string(&name)),
        conditions: carry_transition_times(&previous.conditions, conditions(&observed), now),
        observed_metrics: scaled.observed_metrics.clone(),
        last_scale_time: scaled.last_scale_time.clone(),
        recent_decisions: scaled.recent_decisions.clone(),
        autoscaler: scaled.autoscaler.clone(),
        capacity,
    };
    if md.status.as_ref() != Some(&status) {
        let mds: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = serde_json::json!({
            "apiVersion": "modelfleet.io/v1alpha1",
            "kind": "ModelDeployment",
            "status": status,
        });
        let pp = PatchParams::apply(crate::labels::FIELD_MANAGER).force();
        mds.patch_status(&name, &pp, &Patch::Apply(&patch)).await?;
        ctx.metrics.status_writes.inc();
        events::on_transitions(&ctx, &md, &previous, &status, scaled.decision_reason.as_deref()).await;
    }

    let builtin = md
        .spec
        .autoscaling
        .as_ref()
        .is_some_and(|a| a.mode == AutoscalingMode::Builtin);
    let every = if conflict.is_some() {
        CONFLICT_RETRY
    } else if builtin {
        AUTOSCALE_INTERVAL
    } else {
        RESYNC_INTERVAL
    };
    let every = match md.spec.cost {
        Some(_) => every.min(crate::capacity::SAMPLE_INTERVAL),
        None => every,
    };
    Ok(Action::requeue(if clashes.is_empty() {
        every
    } else {
        every.min(CONFLICT_RECHECK)
    }))
}

/// Used by the builders' callers and tests: the desired objects for a pass.
pub fn desired_objects(
    md: &ModelDeployment,
    cfg: &OperatorConfig,
    replicas: i32,
    token: &str,
) -> (
    k8s_openapi::api::core::v1::Secret,
    Deployment,
    k8s_openapi::api::core::v1::Service,
    k8s_openapi::api::policy::v1::PodDisruptionBudget,
) {
    (
        builders::desired_admin_secret(md, token),
        builders::desired_deployment(md, cfg, replicas),
        builders::desired_service(md),
        builders::desired_pdb(md, replicas),
    )
}

#[cfg(test)]
mod tests;
