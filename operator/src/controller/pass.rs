//! One reconcile pass, in its phases: [`observe`] what exists, [`act`] on it (decide the replica count,
//! apply the owned objects, sweep stray adapters, sample capacity), build the status as a pure function
//! of both ([`desired_status`]), write it only when it changed ([`write_status`]), and say when to
//! come back ([`requeue_after`], pure).
//!
//! Invariants: nothing is applied over an object this ModelDeployment does not control (the pass then
//! only reports the conflict); status is a function of what was observed and decided, never of why
//! the pass was triggered.

use super::{Context, ownership, served_names, sweep};
use crate::Error;
use crate::autoscaler::driver::{self as scale};
use crate::builders;
use crate::labels::selector_string;
use crate::status::{Observed, TenantsSecret, carry_transition_times, conditions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use modelfleet_crds::model_deployment::{AutoscalingMode, CapacityStatus, ModelDeploymentStatus};
use modelfleet_crds::rollout::RolloutStatus;
use modelfleet_crds::{LoraAdapter, ModelDeployment};
use std::time::Duration;

/// What a pass found.
pub struct Seen {
    /// The namespace.
    pub ns: String,
    /// The ModelDeployment's name.
    pub name: String,
    /// The same-named objects that exist, and whether this ModelDeployment controls them.
    pub owned: ownership::Existing,
    /// The runtime pods.
    pub pods: Vec<Pod>,
    /// The tenants Secret.
    pub tenants: TenantsSecret,
    /// The start-up adapter list (the `<md>-adapters` ConfigMap's content).
    pub startup: Vec<crate::builders::adapters::AdapterSpec>,
    /// An object that blocks applying (the `NameConflict` message).
    pub conflict: Option<String>,
    /// Why the pod settings cannot make a pod template (the `InvalidPodTemplate` message): nothing is
    /// applied, the pods of the last good template keep serving.
    pub invalid_pod: Option<String>,
    /// Other deployments claiming one of its served names.
    pub clashes: Vec<served_names::Clash>,
    /// What the pods that are not Ready yet are doing (`status.starting`).
    pub starting: Vec<crate::starting::Sample>,
}

/// What a pass did.
pub struct Acted {
    /// The replica decision and the autoscaler's state.
    pub scaled: scale::Scaled,
    /// The runtime Deployment after applying (`None` when nothing was applied or it is missing).
    pub deployment: Option<Deployment>,
    /// `status.capacity`.
    pub capacity: Option<CapacityStatus>,
    /// `status.rollout` (with a canary strategy).
    pub rollout: Option<RolloutStatus>,
    /// The Event the rollout's move deserves (the walk's).
    pub rollout_event: Option<(&'static str, String)>,
}

/// Reads everything the pass decides from.
pub async fn observe(md: &ModelDeployment, ctx: &Context) -> Result<Seen, Error> {
    let ns = md
        .namespace()
        .ok_or_else(|| Error::Invalid("ModelDeployment without a namespace".into()))?;
    let name = md.name_any();
    let owned = ownership::Existing::read(&ctx.client, md).await?;
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default().labels(&selector_string(&name)))
        .await?
        .items;
    let tenants = tenants_secret(&Api::namespaced(ctx.client.clone(), &ns), md).await?;
    let adapters: Vec<LoraAdapter> = Api::<LoraAdapter>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|a| crate::lora::desired::references(a, &ns, &name))
        .collect();
    let startup = crate::lora::desired::startup_entries(&adapters, &builders::deployment::served_name(md));
    let starting = crate::starting::observe(&ctx.http, &pods).await;
    Ok(Seen {
        conflict: ownership::conflict(md, &owned),
        invalid_pod: builders::desired_deployment(md, &ctx.cfg, 1)
            .err()
            .map(|e| e.to_string()),
        clashes: ctx.peers.clashes(md, ctx.cfg.served_name_scope),
        ns,
        name,
        owned,
        pods,
        tenants,
        startup,
        starting,
    })
}

/// Decides the replica count and applies everything the operator owns, then sweeps stray adapters
/// off the ready pods and samples capacity — or, over a conflict or pod settings that make no pod
/// template, changes nothing.
pub async fn act(md: &ModelDeployment, ctx: &Context, seen: &Seen) -> Result<Acted, Error> {
    if seen.conflict.is_some() || seen.invalid_pod.is_some() {
        return Ok(Acted {
            scaled: scale::unchanged(md),
            deployment: None,
            capacity: md.status.as_ref().and_then(|s| s.capacity.clone()),
            rollout: md.status.as_ref().and_then(|s| s.rollout.clone()),
            rollout_event: None,
        });
    }
    let existing = seen.owned.deployment.as_ref();
    let scaled = ctx.autoscaler.replicas(md, existing, &seen.pods).await;
    let (rollout, rollout_event) = match crate::rollout::drive::step(md, ctx, &seen.pods).await {
        Some(next) => (Some(next.status), next.event),
        None => (None, None),
    };
    let shape = super::apply::Shape {
        replicas: scaled.replicas,
        adapters: &seen.startup,
        rollout: rollout.as_ref(),
    };
    let token = super::apply::owned_objects(md, ctx, &seen.owned, &shape).await?;
    let targets = seen
        .pods
        .iter()
        .filter(|p| modelfleet_crds::pods::is_ready(p))
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
        seen.ns.clone(),
        seen.name.clone(),
        targets,
        token,
    );
    let deployment = Api::<Deployment>::namespaced(ctx.client.clone(), &seen.ns)
        .get_opt(&seen.name)
        .await?;
    let capacity = ctx.capacity.observe(md, &seen.pods).await;
    Ok(Acted {
        scaled,
        deployment,
        capacity,
        rollout,
        rollout_event,
    })
}

/// The status for what was seen and done (pure): conditions from what was observed, their
/// transition times carried over from `md`'s current status.
pub fn desired_status(
    md: &ModelDeployment,
    seen: &Seen,
    acted: &Acted,
    now: Timestamp,
) -> ModelDeploymentStatus {
    let previous = md.status.clone().unwrap_or_default();
    let scaled = &acted.scaled;
    let source = builders::deployment::model_source_key(md);
    let observed = Observed {
        generation: md.metadata.generation.unwrap_or(0),
        digest: &md.spec.model.digest,
        source: &source,
        desired: scaled.replicas,
        deployment: acted.deployment.as_ref(),
        pods: &seen.pods,
        tenants: seen.tenants.clone(),
        scaling: scaled.scaling.clone(),
        conflict: seen.conflict.clone(),
        invalid_pod: seen.invalid_pod.clone(),
        served_name_conflict: served_names::message(&seen.clashes),
        now,
        gpus_reserved: crate::status::gpus_reserved(
            md.spec.runtime.as_ref().and_then(|r| r.resources.as_ref()),
        ),
        unschedulable: crate::starting::unschedulable(&seen.starting),
    };
    let dep_status = acted
        .deployment
        .as_ref()
        .and_then(|d| d.status.clone())
        .unwrap_or_default();
    let (starting, starting_summary) = crate::starting::status(&seen.starting);
    ModelDeploymentStatus {
        observed_generation: md.metadata.generation,
        replicas: dep_status.replicas.unwrap_or(0),
        ready_replicas: dep_status.ready_replicas.unwrap_or(0),
        desired_replicas: Some(scaled.replicas),
        selector: Some(selector_string(&seen.name)),
        conditions: carry_transition_times(
            &previous.conditions,
            crate::rollout::drive::with_condition(conditions(&observed), acted.rollout.as_ref(), now),
            now,
        ),
        observed_metrics: scaled.observed_metrics.clone(),
        last_scale_time: scaled.last_scale_time.clone(),
        recent_decisions: scaled.recent_decisions.clone(),
        autoscaler: scaled.autoscaler.clone(),
        objectives: scaled.objectives.clone(),
        capacity: acted.capacity.clone(),
        rollout: acted.rollout.clone(),
        starting,
        starting_summary,
    }
}

/// Writes `status` with server-side apply when it differs from `md`'s, with the Events its
/// transitions deserve.
pub async fn write_status(
    md: &ModelDeployment,
    ctx: &Context,
    status: ModelDeploymentStatus,
    decision: Option<&str>,
    rollout_event: Option<&(&'static str, String)>,
) -> Result<(), Error> {
    if md.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let ns = md.namespace().unwrap_or_default();
    let mds: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = serde_json::json!({
        "apiVersion": "modelfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "status": status,
    });
    let pp = PatchParams::apply(crate::labels::FIELD_MANAGER).force();
    mds.patch_status(&md.name_any(), &pp, &Patch::Apply(&patch))
        .await?;
    ctx.metrics.status_writes.inc();
    let previous = md.status.clone().unwrap_or_default();
    super::events::on_transitions(ctx, md, &previous, &status, decision, rollout_event).await;
    Ok(())
}

/// When to pass again (pure): soon over a conflict, on the autoscaler's cadence with `Builtin`, on the
/// capacity sampling's with `spec.cost`, else the resync interval; sooner while a served name clashes
/// or pods are starting (their progress is in the status).
pub fn requeue_after(md: &ModelDeployment, seen: &Seen) -> Duration {
    let builtin = md
        .spec
        .autoscaling
        .as_ref()
        .is_some_and(|a| a.mode == AutoscalingMode::Builtin);
    let every = if seen.conflict.is_some() {
        super::CONFLICT_RETRY
    } else if builtin {
        super::AUTOSCALE_INTERVAL
    } else {
        super::RESYNC_INTERVAL
    };
    let every = match md.spec.cost {
        Some(_) => every.min(crate::capacity::SAMPLE_INTERVAL),
        None => every,
    };
    let every = match seen.starting.is_empty() {
        true => every,
        false => every.min(super::STARTING_INTERVAL),
    };
    if seen.clashes.is_empty() {
        every
    } else {
        every.min(super::CONFLICT_RECHECK)
    }
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
