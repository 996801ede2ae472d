//! Scale-ups held while a replica cannot be placed: when the scheduler cannot place one of the
//! deployment's pods (an untolerated taint, a selector no node matches, a full pool), another replica
//! would only wait beside it — so the built-in autoscaler keeps the count until every pod is placed,
//! and says so (`ScalingActive` reason `ScaleUpHeld`; `Schedulable=False` quotes the scheduler).
//!
//! Invariants (pure, table-tested): only a scale-up is held, never a scale-down (the Deployment
//! removes unscheduled pods first); the count never stays below the bounds in force (a `minReplicas`
//! or a schedule window's minimum is the user's, not the autoscaler's); the stabilization state is
//! kept, so the scale-up follows at once when the pods are placed and the load still asks for it.

use super::decide::Decision;
use crate::starting::{State, classify};
use crate::status::Scaling;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// The first pod (name, scheduler's message) the scheduler cannot place, if any.
pub fn unplaced(pods: &[Pod]) -> Option<(String, String)> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find_map(|p| match classify(p) {
            State::Unschedulable(message) => Some((p.name_any(), message)),
            _ => None,
        })
}

/// `decision`, or — when it scales up beyond `max(current, floor)` while `unplaced` names a pod — that
/// count instead, with why (the `ScalingActive` message).
pub fn hold(
    decision: Decision,
    current: i32,
    floor: i32,
    unplaced: Option<&(String, String)>,
) -> (Decision, Option<String>) {
    let keep = current.max(floor);
    match unplaced {
        Some((pod, message)) if decision.replicas > keep => {
            let why = format!(
                "scale-up to {} held at {keep}: pod {pod} cannot be scheduled ({message})",
                decision.replicas
            );
            let held = Decision {
                replicas: keep,
                reason: why.clone(),
                ..decision
            };
            (held, Some(why))
        }
        _ => (decision, None),
    }
}

/// [`hold`] over the deployment's `pods`, with the `ScalingActive` verdict of a held scale-up
/// (`ScaleUpHeld`).
pub fn hold_unplaced(
    decision: Decision,
    current: i32,
    floor: i32,
    pods: &[Pod],
) -> (Decision, Option<Scaling>) {
    let (decision, why) = hold(decision, current, floor, unplaced(pods).as_ref());
    let scaling = why.map(|message| Scaling {
        active: true,
        reason: "ScaleUpHeld".into(),
        message,
    });
    (decision, scaling)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use modelfleet_crds::model_deployment::{AutoscalerState, ScalingCandidate};

    fn decision(replicas: i32) -> Decision {
        Decision {
            replicas,
            state: AutoscalerState {
                scale_up: Some(ScalingCandidate {
                    since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ),
                    replicas: 4,
                }),
                ..Default::default()
            },
            reason: "queue".into(),
        }
    }

    #[test]
    fn scale_ups_hold_while_a_pod_waits_for_a_node_and_nothing_else_does() {
        let waiting = (
            "md-x".to_string(),
            "0/1 nodes are available: 1 node(s) had untolerated taint".to_string(),
        );
        // (decided, current, floor, a pod unplaced) → (replicas, held)
        let cases = [
            (4, 2, 1, true, 2, true),
            (3, 2, 1, false, 3, false),
            (1, 2, 1, true, 1, false),
            (2, 2, 1, true, 2, false),
            (4, 1, 3, true, 3, true),
            (3, 1, 3, true, 3, false),
        ];
        for (decided, current, floor, waits, want, held) in cases {
            let (d, why) = hold(decision(decided), current, floor, waits.then_some(&waiting));
            assert_eq!(
                (d.replicas, why.is_some()),
                (want, held),
                "{decided} from {current}, floor {floor}"
            );
            assert_eq!(d.state, decision(decided).state, "the windows go on");
            if let Some(why) = why {
                assert!(why.contains("md-x") && why.contains("untolerated taint"), "{why}");
                assert_eq!(d.reason, why);
            }
        }
    }

    #[test]
    fn only_pods_the_scheduler_refused_count() {
        let pod = |name: &str, reason: &str, deleting: bool| {
            let mut p = Pod::default();
            p.metadata.name = Some(name.into());
            if deleting {
                p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            }
            p.status = Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "False".into(),
                    reason: Some(reason.into()),
                    message: Some("0/1 nodes are available".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            });
            p
        };
        assert_eq!(unplaced(&[pod("a", "SchedulerError", false)]), None);
        assert_eq!(unplaced(&[pod("a", "Unschedulable", true)]), None);
        assert_eq!(
            unplaced(&[
                pod("a", "SchedulerError", false),
                pod("b", "Unschedulable", false)
            ]),
            Some(("b".into(), "0/1 nodes are available".into()))
        );
    }
}
