//! Events on ModelDeployments: one per condition transition that a user acts on, and one per scaling
//! decision. Publishing is best effort: a failed Event never fails a reconcile.

use super::Context;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;
use kube::runtime::events::{Event, EventType};
use modelfleet_crds::ModelDeployment;
use modelfleet_crds::condition_types::{
    DIGEST_VERIFIED, GPU_UNUSED, READY, RUNTIME_RESTARTS, SCHEDULABLE, STALLED,
};
use modelfleet_crds::model_deployment::ModelDeploymentStatus;

fn find<'a>(cs: &'a [Condition], t: &str) -> Option<&'a Condition> {
    cs.iter().find(|c| c.type_ == t)
}

/// The Events that `previous` → `next` deserves, as (warning?, reason, note).
pub fn transitions(
    previous: &ModelDeploymentStatus,
    next: &ModelDeploymentStatus,
) -> Vec<(bool, String, String)> {
    let mut out = Vec::new();
    for t in [
        READY,
        STALLED,
        DIGEST_VERIFIED,
        RUNTIME_RESTARTS,
        GPU_UNUSED,
        SCHEDULABLE,
    ] {
        let (Some(new), old) = (find(&next.conditions, t), find(&previous.conditions, t)) else {
            continue;
        };
        if old.is_some_and(|o| o.status == new.status && o.reason == new.reason) {
            continue;
        }
        let alarm = [STALLED, RUNTIME_RESTARTS, GPU_UNUSED].contains(&t);
        let inverted = [DIGEST_VERIFIED, SCHEDULABLE].contains(&t);
        let warning = (alarm && new.status == "True") || (inverted && new.status == "False");
        // Nothing to say about a condition that starts out benign (not stalled, not yet verified,
        // no restarts, scheduled).
        let benign = (alarm && new.status == "False")
            || (t == DIGEST_VERIFIED && new.status == "Unknown")
            || (t == SCHEDULABLE && new.status == "True");
        if benign && old.is_none_or(|o| o.status == new.status) {
            continue;
        }
        out.push((
            warning,
            new.reason.clone(),
            format!("{t}={}: {}", new.status, new.message),
        ));
    }
    out
}

/// Publishes the transition Events, the scaling decision and the rollout's move (the walk's Event:
/// a rollback or an abort is a warning).
pub async fn on_transitions(
    ctx: &Context,
    md: &ModelDeployment,
    previous: &ModelDeploymentStatus,
    next: &ModelDeploymentStatus,
    decision: Option<&str>,
    rollout: Option<&(&'static str, String)>,
) {
    let reference = md.object_ref(&());
    let mut events = transitions(previous, next);
    if let Some(d) = decision {
        events.push((false, "Scaled".into(), d.to_string()));
    }
    if let Some((reason, note)) = rollout {
        let warning = ["RolledBack", "RolloutAborted"].contains(reason);
        events.push((warning, reason.to_string(), note.clone()));
    }
    publish(&ctx.recorder, &reference, events).await;
}

/// Publishes `notes` (warning?, reason, note; notes cut to 1,000 characters) on `reference`; a failure
/// to publish is logged at debug level and otherwise ignored (Events are best effort).
pub async fn publish(
    recorder: &kube::runtime::events::Recorder,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    notes: Vec<(bool, String, String)>,
) {
    for (warning, reason, note) in notes {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason,
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, reference).await {
            tracing::debug!(error = %e, "publishing an event failed");
        }
    }
}

/// Publishes a `PodStarted` Event for each runtime pod that turned Ready since the last pass (once per
/// pod, remembered in `ctx.started`), and observes its phases in `modelfleet_operator_pod_start_seconds`.
pub async fn pods_started(ctx: &Context, md: &ModelDeployment, pods: &[k8s_openapi::api::core::v1::Pod]) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut notes = Vec::new();
    for pod in pods {
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        let Some(report) = crate::started::report(pod, now) else {
            continue;
        };
        if !ctx.started.remember(uid) {
            continue;
        }
        for (phase, seconds) in &report.phases {
            ctx.metrics
                .pod_start
                .with_label_values(&[phase.as_str()])
                .observe(*seconds);
        }
        ctx.metrics
            .pod_start
            .with_label_values(&["total"])
            .observe(report.total);
        notes.push((false, "PodStarted".to_string(), report.message()));
    }
    if !notes.is_empty() {
        publish(&ctx.recorder, &md.object_ref(&()), notes).await;
    }
}
