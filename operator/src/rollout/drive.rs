//! A reconcile pass's rollout step: observe what the walk reads (the spec's revision, the canary's
//! readiness, the old pods, the gateway's per-revision traffic, the annotations), walk, and hand the
//! new `status.rollout` to the apply phase, which shapes the Deployments after it ([`super::plan`]).
//!
//! Only ModelDeployments with `spec.rollout.strategy: Canary` have a rollout; for the others this
//! returns `None` and the pass applies the one Deployment as always.

use super::analysis::{self, Thresholds, Traffic, Verdict};
use super::measure;
use super::plan::{TRACK_LABEL, label_revision};
use super::revision::REVISION_LABEL;
use super::walk::{self, Inputs};
use crate::controller::Context;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use modelfleet_crds::ModelDeployment;
use modelfleet_crds::condition_types::PROGRESSING;
use modelfleet_crds::rollout::{
    ABORT_ANNOTATION, PROMOTE_ANNOTATION, RolloutPhase, RolloutStatus, RolloutStrategy,
};
use std::time::{Duration, Instant};

/// How often a pass comes back while a rollout is in flight.
pub const ROLLOUT_INTERVAL: Duration = Duration::from_secs(5);

/// Whether `md` rolls out by canary.
pub fn canary(md: &ModelDeployment) -> bool {
    md.spec
        .rollout
        .as_ref()
        .is_some_and(|r| r.strategy == RolloutStrategy::Canary)
}

/// Whether the rollout is in flight (the pass comes back every [`ROLLOUT_INTERVAL`]).
pub fn in_flight(s: Option<&RolloutStatus>) -> bool {
    s.is_some_and(|s| {
        !matches!(
            s.phase,
            RolloutPhase::Stable | RolloutPhase::RolledBack | RolloutPhase::Aborted
        )
    })
}

/// The revision the spec asks for (`None` when its pod settings cannot make a pod template: the pass
/// then applies nothing and says why).
pub fn desired_revision(md: &ModelDeployment, ctx: &Context) -> Option<String> {
    let mut d = crate::builders::desired_deployment(md, &ctx.cfg, 1).ok()?;
    Some(label_revision(&mut d))
}

fn label<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn is_canary(p: &Pod) -> bool {
    label(p, TRACK_LABEL) == Some("canary")
}

/// The next `status.rollout` for `md` (with `pods` its runtime pods) and the Event its move deserves,
/// or `None` without a canary strategy.
pub async fn step(md: &ModelDeployment, ctx: &Context, pods: &[Pod]) -> Option<walk::Next> {
    if !canary(md) {
        return None;
    }
    let spec = md.spec.rollout.as_ref()?;
    let previous = md.status.as_ref().and_then(|s| s.rollout.as_ref());
    let desired = desired_revision(md, ctx)?;
    let canary_ready = pods.iter().any(|p| {
        is_canary(p) && label(p, REVISION_LABEL) == Some(&desired) && modelfleet_crds::pods::is_ready(p)
    });
    let old_gone = pods.iter().all(|p| label(p, REVISION_LABEL) == Some(&desired))
        && pods
            .iter()
            .any(|p| !is_canary(p) && modelfleet_crds::pods::is_ready(p));
    let verdict = match previous {
        Some(p)
            if matches!(
                p.phase,
                RolloutPhase::Mirroring | RolloutPhase::Progressing | RolloutPhase::Paused
            ) && p.canary_revision.as_deref() == Some(&desired) =>
        {
            judge(md, ctx, spec.analysis.as_ref(), p).await
        }
        _ => None,
    };
    let annotations = md.annotations();
    let inputs = Inputs {
        spec,
        desired: &desired,
        now: Timestamp::now(),
        canary_ready,
        old_gone,
        verdict,
        promote: annotations.get(PROMOTE_ANNOTATION).map(String::as_str),
        abort: annotations.get(ABORT_ANNOTATION).map(String::as_str),
    };
    let next = walk::next(previous, &inputs);
    if !in_flight(Some(&next.status)) {
        ctx.rollouts
            .forget(&md.namespace().unwrap_or_default(), &md.name_any());
    }
    Some(next)
}

/// Reads the gateway and judges the running step's window (`None`: nothing to judge yet).
async fn judge(
    md: &ModelDeployment,
    ctx: &Context,
    analysis: Option<&modelfleet_crds::rollout::RolloutAnalysis>,
    s: &RolloutStatus,
) -> Option<Verdict> {
    let (ns, name) = (md.namespace().unwrap_or_default(), md.name_any());
    let t = match Thresholds::from_spec(analysis) {
        Ok(t) => t,
        Err(e) => return Some(Verdict::Wait(e)),
    };
    let window = Duration::from_secs(t.window_seconds);
    let now = Instant::now();
    let ips = crate::autoscaler::zero::gateway_ips(&ctx.client, &ctx.cfg.gateway).await;
    let reading = match ips {
        Ok(ips) => measure::read(&ctx.http, &ips, ctx.cfg.gateway.metrics_port, &ns, &name).await,
        Err(e) => Err(e),
    };
    match reading {
        Ok(r) => ctx
            .rollouts
            .push(&ns, &name, now, r, window + ROLLOUT_INTERVAL * 2),
        Err(e) => return Some(Verdict::Wait(format!("the gateway's figures: {e}"))),
    }
    // The step's own traffic, over at most the last window.
    let started = s.step_started_at.as_ref().map_or(Timestamp::now(), |t| t.0);
    let in_step: Duration = Timestamp::now()
        .duration_since(started)
        .try_into()
        .unwrap_or_default();
    let since = now.checked_sub(in_step.min(window)).unwrap_or(now);
    let per_revision = ctx.rollouts.window(&ns, &name, since)?;
    let pick = |rev: &str| per_revision.get(rev).cloned().unwrap_or_else(Traffic::default);
    let canary = pick(s.canary_revision.as_deref()?);
    let stable = ctx
        .rollouts
        .stable(&ns, &name, pick(&s.stable_revision), t.min_requests);
    Some(analysis::judge(
        &canary,
        stable.as_ref(),
        &t,
        in_step >= window / 2,
    ))
}

/// `conditions` with the rollout's `Progressing` condition (a canary strategy only): `False` with
/// reason `RolledBack` or `Aborted` once a canary was withdrawn, else `True` (`Canary` in flight,
/// `Stable` otherwise).
pub fn with_condition(
    mut conditions: Vec<Condition>,
    rollout: Option<&RolloutStatus>,
    now: Timestamp,
) -> Vec<Condition> {
    let Some(r) = rollout else {
        return conditions;
    };
    let (status, reason) = match r.phase {
        RolloutPhase::RolledBack => ("False", "RolledBack"),
        RolloutPhase::Aborted => ("False", "Aborted"),
        RolloutPhase::Stable => ("True", "Stable"),
        _ => ("True", "Canary"),
    };
    let message = match r.message.is_empty() {
        true => format!("revision {} serves", r.stable_revision),
        false => r.message.clone(),
    };
    conditions.push(Condition {
        type_: PROGRESSING.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(now),
        observed_generation: None,
    });
    conditions
}
