//! The runtime Deployments a rollout phase asks for (pure).
//!
//! The stable revision runs in the Deployment named after the ModelDeployment (`<md>`); a canary runs
//! beside it in `<md>-canary`, whose pods carry `modelfleet.io/track: canary` (its selector's extra
//! label, so the two Deployments never manage each other's ReplicaSets). While a canary is in flight
//! the stable Deployment keeps the template it has — the spec already describes the canary — and only
//! its replica count follows the split. Promotion rolls the stable Deployment to the canary's
//! template (a rolling update with `maxUnavailable: 0`: the old pods leave only once new ones are
//! Ready, and each finishes its in-flight requests in its termination grace period); the canary
//! Deployment is deleted once no pod of the old revision is left.
//!
//! Replicas: the autoscaler's count `r` is split by weight — canary `max(1, ⌈r·w/100⌉)`, stable
//! `max(1, ⌈r·(100−w)/100⌉)` — so stable keeps one pod to roll back onto at once; while starting or
//! mirroring stable keeps all `r` and the canary gets one (or its mirror share).

use super::revision::{self, REVISION_LABEL};
use k8s_openapi::api::apps::v1::Deployment;
use modelfleet_crds::rollout::{RolloutPhase, RolloutStatus};

/// The pod (and canary selector) label that tells a canary's pods from stable's.
pub const TRACK_LABEL: &str = "modelfleet.io/track";

/// Name of the canary Deployment of ModelDeployment `md`.
pub fn canary_name(md: &str) -> String {
    format!("{md}-canary")
}

/// The Deployments to apply; `canary: None` means the canary Deployment must not exist.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub stable: Deployment,
    pub canary: Option<Deployment>,
}

fn ceil_share(r: i32, percent: i32) -> i32 {
    ((i64::from(r) * i64::from(percent) + 99) / 100).max(1) as i32
}

/// (stable, canary) replicas for `r` in `status`'s phase.
pub fn split(r: i32, s: &RolloutStatus) -> (i32, i32) {
    match s.phase {
        RolloutPhase::Starting => (r, 1),
        RolloutPhase::Mirroring => (r, ceil_share(r, s.mirror_percent)),
        RolloutPhase::Progressing | RolloutPhase::Paused => {
            (ceil_share(r, 100 - s.weight), ceil_share(r, s.weight))
        }
        RolloutPhase::Promoting => (r, ceil_share(r, s.weight)),
        RolloutPhase::Stable | RolloutPhase::RolledBack | RolloutPhase::Aborted => (r, 0),
    }
}

/// Labels the template of `d` with its revision (returned).
pub fn label_revision(d: &mut Deployment) -> String {
    let template = &mut d.spec.as_mut().expect("a built Deployment has a spec").template;
    let rev = revision::of(template);
    template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(Default::default)
        .insert(REVISION_LABEL.into(), rev.clone());
    rev
}

fn with_replicas(mut d: Deployment, n: i32) -> Deployment {
    d.spec.as_mut().expect("a built Deployment has a spec").replicas = Some(n);
    d
}

fn as_canary(mut d: Deployment, md: &str) -> Deployment {
    d.metadata.name = Some(canary_name(md));
    let spec = d.spec.as_mut().expect("a built Deployment has a spec");
    spec.selector
        .match_labels
        .get_or_insert_with(Default::default)
        .insert(TRACK_LABEL.into(), "canary".into());
    spec.template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(Default::default)
        .insert(TRACK_LABEL.into(), "canary".into());
    d
}

/// The plan for `status`: `desired` is the Deployment built from the spec (labelled with its
/// revision, replicas `r`); `existing` the stable Deployment as it is.
pub fn plan(
    md: &str,
    desired: &Deployment,
    existing: Option<&Deployment>,
    status: &RolloutStatus,
    r: i32,
) -> Plan {
    let (stable_n, canary_n) = split(r, status);
    let kept = || {
        let mut d = desired.clone();
        let template = existing.and_then(|e| e.spec.as_ref()).map(|s| s.template.clone());
        if let (Some(t), Some(spec)) = (template, d.spec.as_mut()) {
            spec.template = t;
        }
        d
    };
    let canary = || Some(with_replicas(as_canary(desired.clone(), md), canary_n));
    match status.phase {
        RolloutPhase::Stable => Plan {
            stable: with_replicas(desired.clone(), r),
            canary: None,
        },
        RolloutPhase::RolledBack | RolloutPhase::Aborted => Plan {
            stable: with_replicas(kept(), stable_n),
            canary: None,
        },
        RolloutPhase::Promoting => Plan {
            stable: with_replicas(desired.clone(), stable_n),
            canary: canary(),
        },
        _ => Plan {
            stable: with_replicas(kept(), stable_n),
            canary: canary(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};

    fn deployment(image: &str) -> Deployment {
        let mut d = Deployment {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("chat".into()),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                template: PodTemplateSpec {
                    metadata: None,
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            image: Some(image.into()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            status: None,
        };
        label_revision(&mut d);
        d
    }

    fn status(phase: RolloutPhase, weight: i32) -> RolloutStatus {
        RolloutStatus {
            phase,
            weight,
            stable_revision: "old".into(),
            ..Default::default()
        }
    }

    fn image(d: &Deployment) -> &str {
        d.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .image
            .as_deref()
            .unwrap()
    }

    #[test]
    fn replicas_split_by_weight_and_stable_keeps_one() {
        assert_eq!(split(4, &status(RolloutPhase::Progressing, 10)), (4, 1));
        assert_eq!(split(4, &status(RolloutPhase::Progressing, 50)), (2, 2));
        assert_eq!(split(4, &status(RolloutPhase::Progressing, 100)), (1, 4));
        assert_eq!(split(1, &status(RolloutPhase::Progressing, 50)), (1, 1));
        assert_eq!(split(3, &status(RolloutPhase::Starting, 0)), (3, 1));
        assert_eq!(split(3, &status(RolloutPhase::RolledBack, 0)), (3, 0));
    }

    #[test]
    fn in_flight_the_stable_template_is_kept_and_the_canary_runs_the_spec() {
        let old = deployment("old");
        let new = deployment("new");
        let p = plan(
            "chat",
            &new,
            Some(&old),
            &status(RolloutPhase::Progressing, 10),
            4,
        );
        assert_eq!(image(&p.stable), "old");
        assert_eq!(p.stable.spec.as_ref().unwrap().replicas, Some(4));
        let c = p.canary.unwrap();
        assert_eq!(
            (c.metadata.name.as_deref(), image(&c)),
            (Some("chat-canary"), "new")
        );
        let spec = c.spec.as_ref().unwrap();
        assert_eq!(
            spec.selector.match_labels.as_ref().unwrap()[TRACK_LABEL],
            "canary"
        );
        let labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert_eq!(labels[TRACK_LABEL], "canary");
        assert_eq!(
            labels[REVISION_LABEL],
            revision::of(&new.spec.as_ref().unwrap().template)
        );
    }

    #[test]
    fn promotion_rolls_stable_to_the_spec_and_rollback_drops_the_canary() {
        let old = deployment("old");
        let new = deployment("new");
        let p = plan("chat", &new, Some(&old), &status(RolloutPhase::Promoting, 100), 2);
        assert_eq!(image(&p.stable), "new");
        assert!(p.canary.is_some());
        let p = plan("chat", &new, Some(&old), &status(RolloutPhase::RolledBack, 0), 2);
        assert_eq!((image(&p.stable), p.canary), ("old", None));
        let p = plan("chat", &new, Some(&old), &status(RolloutPhase::Stable, 0), 2);
        assert_eq!((image(&p.stable), p.canary), ("new", None));
    }
}
