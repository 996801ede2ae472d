//! How long a runtime pod took to start, phase by phase, once it turns Ready: the node's part (from
//! scheduling to the fetch container's start: images and image volumes pulled and mounted), the fetch
//! container's phases (its termination message: `Fetched: …; signature 0.1 s, pull 12.3 s, verify
//! 1.1 s, install 0.0 s`), and the runtime's load (from its start to Ready: the model checked and
//! loaded). The operator publishes it as a `PodStarted` Event and in
//! `modelfleet_operator_pod_start_seconds{phase}`.
//!
//! Invariants: pure, from the pod's status alone; a pod is reported once (the caller remembers whom)
//! and only when it turned Ready recently, so an operator restart does not report old pods again.

use crate::labels::{FETCH_CONTAINER, RUNTIME_CONTAINER};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// A pod Ready longer ago than this is not reported (an operator restart, a resync).
pub const REPORT_WITHIN_SECONDS: f64 = 120.0;

/// One pod's start, phase by phase.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The pod.
    pub pod: String,
    /// Seconds from creation to Ready.
    pub total: f64,
    /// `(phase, seconds)` in order: `node` (scheduled → fetch start), the fetch phases, `load`.
    pub phases: Vec<(String, f64)>,
    /// How the fetch got the model (`from the source`, `from the node cache`, `mounted`, …) and its
    /// bytes, if its message said.
    pub how: Option<String>,
}

impl Report {
    /// The Event's message.
    pub fn message(&self) -> String {
        let phases: Vec<String> = self.phases.iter().map(|(p, s)| format!("{p} {s:.1} s")).collect();
        let how = self.how.as_deref().map(|h| format!(" ({h})")).unwrap_or_default();
        format!(
            "pod {} Ready {:.1} s after creation: {}{how}",
            self.pod,
            self.total,
            phases.join(", ")
        )
    }
}

/// The pods already reported (by uid), bounded: the oldest are forgotten past [`Reported::CAP`]
/// (a pod is only reported within minutes of turning Ready, so forgetting an old one repeats nothing).
#[derive(Default)]
pub struct Reported(std::sync::Mutex<std::collections::VecDeque<String>>);

impl Reported {
    /// Most uids remembered.
    pub const CAP: usize = 4096;

    /// Records `uid`; false if it was already there.
    pub fn remember(&self, uid: String) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&uid) {
            return false;
        }
        if seen.len() >= Self::CAP {
            seen.pop_front();
        }
        seen.push_back(uid);
        true
    }
}

fn secs(from: &Timestamp, to: &Timestamp) -> f64 {
    (to.as_millisecond() - from.as_millisecond()) as f64 / 1000.0
}

/// The report of a pod that is Ready and turned Ready within [`REPORT_WITHIN_SECONDS`] of `now`.
pub fn report(pod: &Pod, now: Timestamp) -> Option<Report> {
    let status = pod.status.as_ref()?;
    let cond = |t: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t && c.status == "True")
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0)
    };
    let ready = cond("Ready")?;
    if secs(&ready, &now) > REPORT_WITHIN_SECONDS {
        return None;
    }
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let scheduled = cond("PodScheduled").unwrap_or(created);
    let fetch = status
        .init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == FETCH_CONTAINER)?
        .state
        .as_ref()?
        .terminated
        .clone()?;
    let runtime_started = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == RUNTIME_CONTAINER)?
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()?
        .0;
    let fetch_started = fetch.started_at.as_ref().map(|t| t.0).unwrap_or(scheduled);
    let mut phases = vec![("node".to_string(), secs(&scheduled, &fetch_started).max(0.0))];
    let (how, fetch_phases) = parse_fetch_message(fetch.message.as_deref().unwrap_or_default());
    phases.extend(fetch_phases);
    phases.push(("load".into(), secs(&runtime_started, &ready).max(0.0)));
    Some(Report {
        pod: pod.name_any(),
        total: secs(&created, &ready),
        phases,
        how,
    })
}

/// `Fetched: <uri> (<digest>) <how>, <n> bytes; pull 12.3 s, verify 1.1 s` → (`<how>, <n> bytes`,
/// the phases).
pub fn parse_fetch_message(message: &str) -> (Option<String>, Vec<(String, f64)>) {
    let Some(rest) = message.trim().strip_prefix("Fetched: ") else {
        return (None, vec![]);
    };
    let (head, phases) = rest.rsplit_once("; ").unwrap_or((rest, ""));
    let how = head.rsplit_once(") ").map(|(_, h)| h.to_string());
    let phases = phases
        .split(", ")
        .filter_map(|p| {
            let (name, value) = p.trim().split_once(' ')?;
            Some((name.to_string(), value.trim_end_matches(" s").parse().ok()?))
        })
        .collect();
    (how, phases)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_ready_pod_is_reported_with_its_phases() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "m-1", "creationTimestamp": "2026-12-06T10:00:00Z"},
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-06T10:00:01Z"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-06T10:00:30Z"}],
                "initContainerStatuses": [{"name": "fetch", "image": "i", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": 0,
                        "startedAt": "2026-12-06T10:00:05Z", "finishedAt": "2026-12-06T10:00:20Z",
                        "message": "Fetched: oci://r/m@sha256:x (sha256:y) from the source, 1000 bytes; pull 12.3 s, verify 1.1 s, install 0.0 s\n"}}}],
                "containerStatuses": [{"name": "runtime", "image": "i", "imageID": "", "ready": true,
                    "restartCount": 0, "state": {"running": {"startedAt": "2026-12-06T10:00:21Z"}}}]
            }
        }))
        .unwrap();
        let now: Timestamp = "2026-12-06T10:00:31Z".parse().unwrap();
        let r = report(&pod, now).unwrap();
        assert_eq!(r.total, 30.0);
        let names: Vec<&str> = r.phases.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["node", "pull", "verify", "install", "load"]);
        assert_eq!((r.phases[0].1, r.phases[1].1, r.phases[4].1), (4.0, 12.3, 9.0));
        assert_eq!(r.how.as_deref(), Some("from the source, 1000 bytes"));
        assert!(
            r.message()
                .starts_with("pod m-1 Ready 30.0 s after creation: node 4.0 s, pull 12.3 s")
        );
        let later: Timestamp = "2026-12-06T10:10:00Z".parse().unwrap();
        assert_eq!(report(&pod, later), None, "not reported long after");
    }

    #[test]
    fn fetch_messages() {
        assert_eq!(parse_fetch_message("DigestMismatch: x"), (None, vec![]));
        let (how, phases) = parse_fetch_message("Fetched: pvc://c (sha256:a) mounted, 0 bytes; verify 0.5 s");
        assert_eq!(how.as_deref(), Some("mounted, 0 bytes"));
        assert_eq!(phases, vec![("verify".to_string(), 0.5)]);
    }
}
