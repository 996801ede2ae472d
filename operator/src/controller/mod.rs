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
mod pass;
pub mod peers;
mod served_names;
pub mod sweep;

use crate::Error;
use crate::builders;
use crate::config::OperatorConfig;
use crate::labels::{APP_NAME, MODEL_DEPLOYMENT_LABEL};
use crate::scope::{self, Scope};
use crate::telemetry::Metrics;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, ResourceExt};
use modelfleet_crds::{LoraAdapter, ModelDeployment, ModelDeploymentStatus};
use std::sync::Arc;
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
    /// The built-in autoscaler: per ModelDeployment when its metrics were last read (the rate limit)
    /// and the stabilization windows (authoritative while this replica leads).
    pub autoscaler: crate::autoscaler::Autoscaler,
    /// Starts the adapter sweeps.
    pub sweeper: sweep::Sweeper,
    /// Every ModelDeployment and LoraAdapter in scope (served-name conflicts).
    pub peers: peers::Peers,
    /// Per ModelDeployment with `spec.cost`: capacity samples and figures.
    pub capacity: crate::capacity::Capacity,
    /// Per ModelDeployment with a canary in flight: the gateway's per-revision readings.
    pub rollouts: crate::rollout::measure::History,
    /// Runtime pods whose start was already reported (`PodStarted`).
    pub started: crate::started::Reported,
}

pub use crate::autoscaler::AUTOSCALE_INTERVAL;
/// How often other ModelDeployments are passed over (and their pods swept) without a change.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(60);
/// How often a pass stopped by a `NameConflict` looks again.
pub const CONFLICT_RETRY: Duration = Duration::from_secs(30);
/// How often a deployment in a served-name conflict looks again (the peer going away announces
/// nothing to this deployment).
pub const CONFLICT_RECHECK: Duration = Duration::from_secs(10);
/// How often a deployment with starting pods is passed over (their progress in `status.starting`).
pub const STARTING_INTERVAL: Duration = Duration::from_secs(3);

/// Runs the controller until a shutdown signal, with one set of watches per partition of `scope`.
pub async fn run(client: Client, cfg: OperatorConfig, metrics: Arc<Metrics>, identity: &str, scope: &Scope) {
    let http = crate::autoscaler::metrics::http_client();
    let reporter = Reporter {
        controller: "modelfleet-operator".into(),
        instance: Some(identity.into()),
    };
    let (peers, feeds) = peers::Peers::new(scope.partitions());
    let ctx = Arc::new(Context {
        capacity: crate::capacity::Capacity::new(http.clone(), metrics.clone()),
        rollouts: Default::default(),
        autoscaler: crate::autoscaler::Autoscaler::new(
            http.clone(),
            client.clone(),
            cfg.gateway.clone(),
            metrics.clone(),
        ),
        client: client.clone(),
        cfg,
        http,
        metrics,
        recorder: Recorder::new(client.clone(), reporter),
        sweeper: sweep::Sweeper::new(crate::lora::admin::http_client()),
        peers,
        started: Default::default(),
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

/// One pass for one ModelDeployment: observe, act, write the status if it changed, requeue.
pub async fn reconcile(md: Arc<ModelDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.duration.start_timer();
    ctx.metrics.reconciliations.inc();
    let seen = pass::observe(&md, &ctx).await?;
    let acted = pass::act(&md, &ctx, &seen).await?;
    let status = pass::desired_status(&md, &seen, &acted, Timestamp::now());
    let rollout_in_flight = crate::rollout::drive::in_flight(status.rollout.as_ref());
    let decision = acted.scaled.decision_reason.as_deref();
    trace_decision(&status, decision, rollout_in_flight);
    pass::write_status(&md, &ctx, status, decision, acted.rollout_event.as_ref()).await?;
    events::pods_started(&ctx, &md, &seen.pods).await;
    let every = pass::requeue_after(&md, &seen);
    Ok(Action::requeue(match rollout_in_flight {
        true => every.min(crate::rollout::drive::ROLLOUT_INTERVAL),
        false => every,
    }))
}

/// Writes what this pass decided on the reconcile's span (kube-runtime opens one per reconcile,
/// `reconciling object`; exported when the operator traces): the replicas wanted and why, whether a
/// rollout is under way, and every condition — the digest's verdict among them.
fn trace_decision(status: &ModelDeploymentStatus, decision: Option<&str>, rollout: bool) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let span = tracing::Span::current();
    span.set_attribute(
        "modelfleet.replicas.desired",
        i64::from(status.desired_replicas.unwrap_or(0)),
    );
    span.set_attribute("modelfleet.replicas.ready", i64::from(status.ready_replicas));
    span.set_attribute("modelfleet.scale.reason", decision.unwrap_or("").to_string());
    span.set_attribute("modelfleet.rollout.in_flight", rollout);
    let conditions: Vec<String> = status
        .conditions
        .iter()
        .map(|c| format!("{}={}({})", c.type_, c.status, c.reason))
        .collect();
    span.set_attribute("modelfleet.conditions", conditions.join(" "));
}

/// Used by the builders' callers and tests: the desired objects for a pass, or why the pod settings
/// cannot make a pod template.
pub fn desired_objects(
    md: &ModelDeployment,
    cfg: &OperatorConfig,
    replicas: i32,
    token: &str,
) -> Result<
    (
        k8s_openapi::api::core::v1::Secret,
        Deployment,
        k8s_openapi::api::core::v1::Service,
        k8s_openapi::api::policy::v1::PodDisruptionBudget,
    ),
    builders::placement::PodTemplateError,
> {
    Ok((
        builders::desired_admin_secret(md, token),
        builders::desired_deployment(md, cfg, replicas)?,
        builders::desired_service(md),
        builders::desired_pdb(md, replicas),
    ))
}

#[cfg(test)]
mod tests;
