//! Runtime containers that restarted recently, and why: the last termination's reason, exit code and
//! message (the runtime writes its fatal reason — a panic, an engine failure, a refused start-up — to
//! its termination log; the kubelet puts it in the pod's status). The ModelDeployment's
//! `RuntimeRestarts` condition and its Event quote it, so a crash loop — a poison request repeated, a
//! memory limit too small — is visible from `kubectl describe md` without reading pod logs.
//!
//! Invariants: a pure function of the pods and `now`; a restart counts for [`WINDOW`] after its
//! container terminated, so the condition clears by itself once restarts stop (one transition, not a
//! ticking status).

use crate::labels::RUNTIME_CONTAINER;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// How long a restart keeps the condition true.
pub const WINDOW: SignedDuration = SignedDuration::from_mins(10);
/// Characters of a termination message quoted.
const MAX_MESSAGE: usize = 300;

/// What the pods say about recent restarts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restarts {
    /// Pods whose runtime container terminated within the window.
    pub pods: usize,
    /// Their restart counts, summed.
    pub restarts: i32,
    /// The latest termination: pod, exit code, kubelet reason (`Error`, `OOMKilled`, …), message.
    pub latest: (String, i32, String, String),
}

impl Restarts {
    /// The condition's message.
    pub fn message(&self) -> String {
        let (pod, code, reason, message) = &self.latest;
        format!(
            "{} runtime container(s) restarted in the last {} minutes ({} restarts in all); the latest, \
             in pod {pod}, exited {code} ({reason}){}",
            self.pods,
            WINDOW.as_mins(),
            self.restarts,
            if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            }
        )
    }
}

/// The runtime containers of `pods` that terminated within [`WINDOW`] before `now` and were restarted.
pub fn recent(pods: &[Pod], now: Timestamp) -> Option<Restarts> {
    let mut found: Option<Restarts> = None;
    let mut latest_at: Option<Timestamp> = None;
    for pod in pods {
        let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
        for s in statuses
            .into_iter()
            .flatten()
            .filter(|s| s.name == RUNTIME_CONTAINER)
        {
            let Some(t) = s.last_state.as_ref().and_then(|l| l.terminated.as_ref()) else {
                continue;
            };
            let Some(at) = t.finished_at.as_ref().map(|f| f.0) else {
                continue;
            };
            if s.restart_count == 0 || now.duration_since(at) > WINDOW {
                continue;
            }
            let message: String = t
                .message
                .as_deref()
                .unwrap_or_default()
                .trim()
                .lines()
                .last()
                .unwrap_or_default()
                .chars()
                .take(MAX_MESSAGE)
                .collect();
            let entry = (
                pod.metadata.name.clone().unwrap_or_default(),
                t.exit_code,
                t.reason.clone().unwrap_or_default(),
                message,
            );
            let r = found.get_or_insert_with(|| Restarts {
                pods: 0,
                restarts: 0,
                latest: entry.clone(),
            });
            r.pods += 1;
            r.restarts += s.restart_count;
            if latest_at.is_none_or(|l| at > l) {
                latest_at = Some(at);
                r.latest = entry;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(name: &str, restarts: i32, finished: Option<Timestamp>, message: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: RUNTIME_CONTAINER.into(),
                    restart_count: restarts,
                    last_state: finished.map(|f| ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: 134,
                            reason: Some("Error".into()),
                            message: Some(message.into()),
                            finished_at: Some(Time(f)),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn recent_restarts_name_the_latest_reason_and_old_ones_clear() {
        let now: Timestamp = "2026-12-04T12:00:00Z".parse().unwrap();
        let mins = |m: i64| now - SignedDuration::from_mins(m);
        assert_eq!(recent(&[pod("a", 0, None, "")], now), None);
        assert_eq!(recent(&[pod("a", 3, Some(mins(11)), "old")], now), None);
        let r = recent(
            &[
                pod("a", 1, Some(mins(5)), "panic in thread x: boom"),
                pod(
                    "b",
                    2,
                    Some(mins(1)),
                    "stack\nfault injection: aborted on a request carrying the armed marker",
                ),
                pod("c", 4, Some(mins(30)), "too old"),
            ],
            now,
        )
        .unwrap();
        assert_eq!((r.pods, r.restarts), (2, 3));
        assert_eq!(r.latest.0, "b");
        let m = r.message();
        assert!(
            m.contains("pod b, exited 134 (Error): fault injection: aborted"),
            "{m}"
        );
    }
}
