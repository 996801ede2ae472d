//! `status.starting`: what each runtime pod that is not Ready yet is doing — waiting for a node, the
//! node pulling images (the runtime's, or the model's image volume), the fetch container's phases
//! with bytes, rate and ETA (polled from its `/progress` on the admin port), the runtime loading the
//! model — and the one-line summary for `kubectl get md`.
//!
//! Invariants: a poll is one bounded request per fetching pod (a 1 s timeout, a capped body), so a
//! slow pod costs a pass at most that; what is written is rounded (bytes to 1 MB, rates to 3
//! significant digits) so a status write follows real progress, not noise; secrets never appear (the
//! progress document holds numbers only).

use crate::body::read_capped;
use crate::labels::{ADMIN_PORT, FETCH_CONTAINER, RUNTIME_CONTAINER};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::ResourceExt;
use modelfleet_crds::starting::{MAX_STARTING, PodStart};
use std::time::Duration;

/// Longest a progress poll may take.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(1);
/// Most bytes of a progress document read.
const MAX_PROGRESS_BYTES: usize = 64 << 10;

/// The fetch container's progress document (`fetch --progress-addr`).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// `signature`, `pull`, `verify`, `install`, `done`.
    pub phase: String,
    /// Bytes pulled so far.
    pub bytes: u64,
    /// Bytes expected (0: not known yet).
    pub expected_bytes: u64,
    /// Seconds in the current phase.
    pub phase_seconds: f64,
}

/// What one pod is doing.
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    /// Not on a node yet (the scheduler's message, if it gave one).
    Scheduling(Option<String>),
    /// The scheduler cannot place it.
    Unschedulable(String),
    /// On a node, its containers not started: the node pulls images (and image volumes).
    ImagePull,
    /// The fetch container runs; its progress, if the poll answered.
    Fetch(Option<Progress>),
    /// The runtime container runs and is not Ready yet.
    Load,
    /// A container cannot start or keeps failing (`reason: message`).
    Failed(String),
}

/// A pod and its state.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The pod's name.
    pub pod: String,
    /// What it is doing.
    pub state: State,
}

/// The state of every pod that is neither Ready nor being deleted, fetch progress polled.
pub async fn observe(http: &reqwest::Client, pods: &[Pod]) -> Vec<Sample> {
    let mut out = Vec::new();
    for pod in pods.iter().take(MAX_STARTING) {
        if pod.metadata.deletion_timestamp.is_some() || modelfleet_crds::pods::is_ready(pod) {
            continue;
        }
        let state = match classify(pod) {
            State::Fetch(_) => State::Fetch(poll(http, pod).await),
            other => other,
        };
        out.push(Sample {
            pod: pod.name_any(),
            state,
        });
    }
    out
}

async fn poll(http: &reqwest::Client, pod: &Pod) -> Option<Progress> {
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    let resp = http
        .get(format!("http://{ip}:{ADMIN_PORT}/progress"))
        .timeout(POLL_TIMEOUT)
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let body = read_capped(resp, MAX_PROGRESS_BYTES).await.ok()?;
    serde_json::from_slice(&body).ok()
}

/// A pod's state from its status alone (pure; a fetching pod's progress is polled by the caller).
pub fn classify(pod: &Pod) -> State {
    let Some(status) = pod.status.as_ref() else {
        return State::Scheduling(None);
    };
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(c) = unscheduled {
        let message = c.message.clone().unwrap_or_default();
        return match c.reason.as_deref() {
            Some("Unschedulable") => State::Unschedulable(message),
            _ => State::Scheduling((!message.is_empty()).then_some(message)),
        };
    }
    let find = |list: &Option<Vec<ContainerStatus>>, name: &str| {
        list.iter().flatten().find(|c| c.name == name).cloned()
    };
    let fetch = find(&status.init_container_statuses, FETCH_CONTAINER);
    let runtime = find(&status.container_statuses, RUNTIME_CONTAINER);
    if let Some(failed) = [&fetch, &runtime].into_iter().flatten().find_map(failure) {
        return State::Failed(failed);
    }
    let fetch_done = fetch
        .as_ref()
        .and_then(|c| c.state.as_ref()?.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0);
    if fetch
        .as_ref()
        .is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
    {
        return State::Fetch(None);
    }
    let runtime_running = runtime
        .as_ref()
        .is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    if fetch_done && runtime_running {
        State::Load
    } else if status.pod_ip.is_none() && status.host_ip.is_none() {
        State::Scheduling(None)
    } else {
        // On a node, no container running: images (and image volumes) are being pulled or unpacked.
        State::ImagePull
    }
}

/// `reason: message` of a container that cannot start or failed its last run, if it did.
fn failure(c: &ContainerStatus) -> Option<String> {
    let state = c.state.as_ref()?;
    if let Some(w) = &state.waiting {
        let reason = w.reason.as_deref().unwrap_or_default();
        if !matches!(reason, "" | "PodInitializing" | "ContainerCreating") {
            let message = w.message.clone().unwrap_or_default();
            let last = c
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.message.clone())
                .unwrap_or_default();
            let detail = if message.is_empty() { last } else { message };
            return Some(
                format!("{reason}: {}", detail.trim())
                    .trim_end_matches(": ")
                    .to_string(),
            );
        }
    }
    None
}

/// The scheduler's message for the first pod it cannot place, if any (the `Schedulable` condition).
pub fn unschedulable(samples: &[Sample]) -> Option<String> {
    samples.iter().find_map(|s| match &s.state {
        State::Unschedulable(m) => Some(format!("pod {}: {m}", s.pod)),
        _ => None,
    })
}

/// `status.starting` and `status.startingSummary` from the samples (pure).
pub fn status(samples: &[Sample]) -> (Vec<PodStart>, Option<String>) {
    let starts: Vec<PodStart> = samples.iter().map(pod_start).collect();
    let summary = summary(&starts);
    (starts, summary)
}

fn pod_start(s: &Sample) -> PodStart {
    let (phase, message) = match &s.state {
        State::Scheduling(m) => ("Scheduling", m.clone()),
        State::Unschedulable(m) => ("Unschedulable", Some(m.clone())),
        State::ImagePull => ("ImagePull", None),
        State::Load => ("Load", None),
        State::Failed(m) => ("Failed", Some(m.clone())),
        State::Fetch(None) => ("Pull", None),
        State::Fetch(Some(p)) => {
            return fetch_start(&s.pod, p);
        }
    };
    PodStart {
        pod: s.pod.clone(),
        phase: phase.into(),
        message: message.map(|m| m.chars().take(512).collect()),
        ..Default::default()
    }
}

fn fetch_start(pod: &str, p: &Progress) -> PodStart {
    let phase = match p.phase.as_str() {
        "signature" => "Signature",
        "verify" => "Verify",
        "install" | "done" => "Install",
        _ => "Pull",
    };
    let pulling = phase == "Pull";
    let rate = (pulling && p.phase_seconds >= 1.0).then(|| round3(p.bytes as f64 / p.phase_seconds));
    let total = (p.expected_bytes > 0).then_some(p.expected_bytes);
    let eta = match (rate, total) {
        (Some(r), Some(t)) if r > 0 => Some((t.saturating_sub(p.bytes) as f64 / r as f64).ceil() as i64),
        _ => None,
    };
    PodStart {
        pod: pod.to_string(),
        phase: phase.into(),
        bytes: pulling.then(|| round_mb(p.bytes)),
        total_bytes: total.map(|t| t as i64),
        bytes_per_second: rate,
        eta_seconds: eta,
        message: None,
    }
}

/// Bytes rounded down to whole megabytes (10⁶).
fn round_mb(b: u64) -> i64 {
    (b / 1_000_000 * 1_000_000) as i64
}

/// A rate rounded to 3 significant digits.
fn round3(x: f64) -> i64 {
    if x < 1000.0 {
        return x.round() as i64;
    }
    let scale = 10f64.powi(x.log10().floor() as i32 - 2);
    ((x / scale).round() * scale) as i64
}

/// One line: the first pod's phase and progress, and how many others there are.
fn summary(starts: &[PodStart]) -> Option<String> {
    let first = starts.first()?;
    let mut line = format!("{} {}", starts.len(), first.phase);
    if let (Some(b), Some(t)) = (first.bytes, first.total_bytes) {
        line.push_str(&format!(" {}/{}", human(b), human(t)));
    }
    if let Some(r) = first.bytes_per_second {
        line.push_str(&format!(" {}/s", human(r)));
    }
    if let Some(eta) = first.eta_seconds {
        line.push_str(&format!(" ETA {}", duration(eta)));
    }
    Some(line)
}

fn human(bytes: i64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.0} MB", b / 1e6)
    } else {
        format!("{:.0} kB", b / 1e3)
    }
}

fn duration(s: i64) -> String {
    match s {
        s if s >= 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests;
