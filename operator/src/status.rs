//! ModelDeployment status as a pure function of what the reconciler observed (the runtime Deployment, its
//! pods, the referenced Secret, the autoscaler's verdict) and the previous status.
//!
//! Invariants: conditions follow kstatus (`Ready`, `Reconciling`, `Stalled`) plus `DigestVerified`,
//! `ScalingActive`, `Degraded`, `RuntimeRestarts`, `ServedNameConflict`, `Schedulable`; a condition's `lastTransitionTime` changes only when its status does, so a
//! pass over an unchanged world produces a byte-identical status (no write, no event).

use crate::labels::{DIGEST_ANNOTATION, FETCH_CONTAINER, SOURCE_ANNOTATION};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use modelfleet_crds::condition_types::*;

/// What the referenced tenants Secret looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantsSecret {
    /// No `spec.tenants`: single-tenant.
    NotReferenced,
    /// Exists and has the key.
    Present,
    /// The Secret does not exist.
    Missing(String),
    /// The Secret lacks the key.
    MissingKey(String, String),
}

/// The autoscaler's standing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scaling {
    /// Whether the built-in autoscaler is acting on fresh metrics.
    pub active: bool,
    /// Condition reason.
    pub reason: String,
    /// Condition message.
    pub message: String,
}

/// Everything one reconcile pass observed.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// `metadata.generation` of the ModelDeployment.
    pub generation: i64,
    /// `spec.model.digest`.
    pub digest: &'a str,
    /// The hash of `spec.model` that pods made for it carry.
    pub source: &'a str,
    /// Replicas the operator is driving towards.
    pub desired: i32,
    /// The runtime Deployment, if it exists.
    pub deployment: Option<&'a Deployment>,
    /// The runtime pods.
    pub pods: &'a [Pod],
    /// The tenants Secret.
    pub tenants: TenantsSecret,
    /// The autoscaler.
    pub scaling: Scaling,
    /// A same-named object this ModelDeployment does not control (the `NameConflict` message): the
    /// pass applied nothing.
    pub conflict: Option<String>,
    /// Why the pod settings make no pod template (the `InvalidPodTemplate` message): the pass applied
    /// nothing, so the current spec has no pods.
    pub invalid_pod: Option<String>,
    /// Served names another deployment behind the same gateway claims too (the condition's message).
    pub served_name_conflict: Option<String>,
    /// When the pass ran (restarts count for a window before it).
    pub now: Timestamp,
    /// GPUs `runtime.resources` reserves (`name: quantity`, e.g. `nvidia.com/gpu: 1`), if any.
    pub gpus_reserved: Option<String>,
    /// The scheduler's message for a runtime pod it cannot place, if one waits.
    pub unschedulable: Option<String>,
}

/// The GPU resources (`*/gpu`) a runtime's requests or limits name, as `name: quantity`, or `None`.
pub fn gpus_reserved(resources: Option<&k8s_openapi::api::core::v1::ResourceRequirements>) -> Option<String> {
    let r = resources?;
    let mut named: std::collections::BTreeMap<&str, &str> = Default::default();
    for map in [r.limits.as_ref(), r.requests.as_ref()].into_iter().flatten() {
        for (k, v) in map {
            if k.ends_with("/gpu") && v.0.trim() != "0" {
                named.entry(k.as_str()).or_insert(v.0.as_str());
            }
        }
    }
    (!named.is_empty()).then(|| {
        named
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// The verdict of the fetch init containers of pods made for the current digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DigestVerdict {
    /// At least one pod verified the bytes.
    Verified,
    /// A pod's fetch failed: (reason word, message).
    Failed(String, String),
    /// No pod has finished fetching yet.
    Pending,
}

fn fetch_terminations(pod: &Pod) -> Vec<ContainerStateTerminated> {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.clone())
        .unwrap_or_default();
    statuses
        .into_iter()
        .filter(|s| s.name == FETCH_CONTAINER)
        .flat_map(|s| {
            [
                s.state.and_then(|st| st.terminated),
                s.last_state.and_then(|st| st.terminated),
            ]
            .into_iter()
            .flatten()
        })
        .collect()
}

/// Reads the digest verdict from the init-container termination messages of the pods made for the
/// model as it is now (`source`: [`crate::builders::deployment::model_source_key`]; a pod an older
/// operator made, without that annotation, counts when it was made for `digest`).
pub fn digest_verdict(pods: &[Pod], digest: &str, source: &str) -> DigestVerdict {
    let current = pods.iter().filter(|p| {
        let annotations = p.metadata.annotations.as_ref();
        match annotations.and_then(|a| a.get(SOURCE_ANNOTATION)) {
            Some(s) => s == source,
            None => annotations
                .and_then(|a| a.get(DIGEST_ANNOTATION))
                .is_some_and(|d| d == digest),
        }
    });
    let mut failure = None;
    for pod in current {
        for t in fetch_terminations(pod) {
            if t.exit_code == 0 {
                return DigestVerdict::Verified;
            }
            let message = t.message.clone().unwrap_or_default().trim().to_string();
            let reason = message
                .split_once(':')
                .map(|(r, _)| r.trim())
                .filter(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric()))
                .unwrap_or("FetchFailed")
                .to_string();
            failure.get_or_insert((reason, message));
        }
    }
    match failure {
        Some((reason, message)) => DigestVerdict::Failed(reason, message),
        None => DigestVerdict::Pending,
    }
}

fn condition(type_: &str, status: bool, reason: &str, message: String, generation: i64) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: Some(generation),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

/// Keeps each condition's previous `lastTransitionTime` when its status did not change; stamps `now`
/// otherwise.
pub fn carry_transition_times(
    previous: &[Condition],
    mut next: Vec<Condition>,
    now: Timestamp,
) -> Vec<Condition> {
    for c in &mut next {
        c.last_transition_time = match previous.iter().find(|p| p.type_ == c.type_) {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Time(now),
        };
    }
    next
}

/// What the runtime Deployment's status says about the rollout.
struct Rollout {
    ready: i32,
    rolled_out: bool,
    deadline_exceeded: bool,
}

fn rollout_of(obs: &Observed) -> Rollout {
    let dep_status = obs.deployment.and_then(|d| d.status.clone()).unwrap_or_default();
    let dep_generation = obs.deployment.and_then(|d| d.metadata.generation).unwrap_or(0);
    let ready = dep_status.ready_replicas.unwrap_or(0);
    let updated = dep_status.updated_replicas.unwrap_or(0);
    let total = dep_status.replicas.unwrap_or(0);
    let rolled_out = obs.deployment.is_some()
        && obs.invalid_pod.is_none()
        && dep_status.observed_generation.unwrap_or(0) >= dep_generation
        && updated == obs.desired
        && total == obs.desired
        && ready >= obs.desired;
    let deadline_exceeded = dep_status.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing"
            && c.status == "False"
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    Rollout {
        ready,
        rolled_out,
        deadline_exceeded,
    }
}

fn digest_condition(verdict: &DigestVerdict, digest: &str, g: i64) -> Condition {
    match verdict {
        DigestVerdict::Verified => condition(
            DIGEST_VERIFIED,
            true,
            "Verified",
            format!("model bytes match {digest}"),
            g,
        ),
        DigestVerdict::Failed(reason, message) => {
            condition(DIGEST_VERIFIED, false, reason, message.clone(), g)
        }
        DigestVerdict::Pending => {
            let mut c = condition(
                DIGEST_VERIFIED,
                false,
                "Pending",
                "no pod has fetched the model yet".into(),
                g,
            );
            c.status = "Unknown".into();
            c
        }
    }
}

/// Stalled: progress needs a user's action (reason, message).
fn stall_of(obs: &Observed, verdict: &DigestVerdict, r: &Rollout) -> Option<(String, String)> {
    match (&obs.tenants, verdict) {
        _ if obs.conflict.is_some() => {
            Some(("NameConflict".into(), obs.conflict.clone().unwrap_or_default()))
        }
        _ if obs.invalid_pod.is_some() => Some((
            "InvalidPodTemplate".into(),
            obs.invalid_pod.clone().unwrap_or_default(),
        )),
        (TenantsSecret::Missing(name), _) => Some((
            "SecretNotFound".into(),
            format!("tenants Secret {name:?} does not exist"),
        )),
        (TenantsSecret::MissingKey(name, key), _) => Some((
            "SecretKeyNotFound".into(),
            format!("tenants Secret {name:?} has no key {key:?}"),
        )),
        (_, DigestVerdict::Failed(reason, message)) => Some((reason.clone(), message.clone())),
        _ if r.deadline_exceeded && !r.rolled_out => Some((
            "ProgressDeadlineExceeded".into(),
            "the runtime Deployment made no progress within its deadline".into(),
        )),
        _ => None,
    }
}

fn ready_condition(obs: &Observed, r: &Rollout, stall: &Option<(String, String)>, g: i64) -> Condition {
    let ready_message = format!("{}/{} replicas ready", r.ready, obs.desired);
    if r.rolled_out && obs.desired > 0 {
        condition(READY, true, "Ready", ready_message, g)
    } else if r.rolled_out && stall.is_none() {
        // `minReplicas: 0` and idle: nothing to wait for; the gateway wakes it on the next request.
        condition(
            READY,
            true,
            "ScaledToZero",
            "0 replicas: scaled to zero; a request through the gateway scales it back up".into(),
            g,
        )
    } else if let Some((reason, _)) = stall {
        condition(READY, false, reason, ready_message, g)
    } else if obs.deployment.is_none() {
        condition(
            READY,
            false,
            "Creating",
            "the runtime Deployment does not exist yet".into(),
            g,
        )
    } else {
        condition(READY, false, "Progressing", ready_message, g)
    }
}

fn gpu_condition(obs: &Observed, g: i64) -> Condition {
    match &obs.gpus_reserved {
        Some(gpus) => condition(
            GPU_UNUSED,
            true,
            "CPUEngine",
            format!(
                "runtime.resources reserves {gpus}, but the engine runs on CPU only in this release: the GPU \
                 is reserved on the node and unused (docs/install.md)"
            ),
            g,
        ),
        None => condition(GPU_UNUSED, false, "NoGPUReserved", String::new(), g),
    }
}

/// `Schedulable`: `False` with the scheduler's message while a runtime pod cannot be placed (a taint,
/// a selector, resources, a PersistentVolumeClaim that does not exist).
fn schedulable_condition(obs: &Observed, g: i64) -> Condition {
    match &obs.unschedulable {
        Some(message) => condition(SCHEDULABLE, false, "Unschedulable", message.clone(), g),
        None => condition(SCHEDULABLE, true, "Scheduled", String::new(), g),
    }
}

/// The conditions for `obs` (transition times still to be carried over).
pub fn conditions(obs: &Observed) -> Vec<Condition> {
    let g = obs.generation;
    let r = rollout_of(obs);
    let verdict = digest_verdict(obs.pods, obs.digest, obs.source);
    let stall = stall_of(obs, &verdict, &r);
    let ready_condition = ready_condition(obs, &r, &stall, g);
    let is_ready = ready_condition.status == "True";
    let stalled_condition = match &stall {
        Some((reason, message)) if !is_ready => condition(STALLED, true, reason, message.clone(), g),
        _ => condition(STALLED, false, "NotStalled", String::new(), g),
    };
    let ready_message = format!("{}/{} replicas ready", r.ready, obs.desired);
    let reconciling_condition = if !is_ready && stall.is_none() {
        condition(RECONCILING, true, "Progressing", ready_message.clone(), g)
    } else {
        condition(RECONCILING, false, "Idle", String::new(), g)
    };
    let degraded_condition = if r.ready > 0 && r.ready < obs.desired {
        condition(DEGRADED, true, "BelowDesired", ready_message, g)
    } else if r.ready > 0 && stall.is_some() {
        condition(
            DEGRADED,
            true,
            "NewRevisionFailing",
            "older replicas keep serving".into(),
            g,
        )
    } else {
        condition(DEGRADED, false, "AsDesired", String::new(), g)
    };
    let scaling_condition = condition(
        SCALING_ACTIVE,
        obs.scaling.active,
        &obs.scaling.reason,
        obs.scaling.message.clone(),
        g,
    );
    let restarts_condition = match crate::restarts::recent(obs.pods, obs.now) {
        Some(rs) => condition(RUNTIME_RESTARTS, true, "RecentRestarts", rs.message(), g),
        None => condition(RUNTIME_RESTARTS, false, "NoRecentRestarts", String::new(), g),
    };
    let conflict_condition = match &obs.served_name_conflict {
        Some(message) => condition(
            SERVED_NAME_CONFLICT,
            true,
            "ServedNameConflict",
            message.clone(),
            g,
        ),
        None => condition(SERVED_NAME_CONFLICT, false, "Unique", String::new(), g),
    };
    vec![
        ready_condition,
        reconciling_condition,
        stalled_condition,
        digest_condition(&verdict, obs.digest, g),
        scaling_condition,
        degraded_condition,
        restarts_condition,
        gpu_condition(obs, g),
        conflict_condition,
        schedulable_condition(obs, g),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, PodStatus};
    use std::collections::BTreeMap;

    const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn pod(digest: &str, exit: Option<(i32, &str)>) -> Pod {
        let mut p = Pod::default();
        p.metadata.annotations = Some(BTreeMap::from([(
            DIGEST_ANNOTATION.to_string(),
            digest.to_string(),
        )]));
        let state = exit.map(|(code, msg)| ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                message: Some(msg.into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        p.status = Some(PodStatus {
            init_container_statuses: Some(vec![ContainerStatus {
                name: FETCH_CONTAINER.into(),
                state,
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    fn deployment(desired: i32, ready: i32, updated: i32, total: i32) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.generation = Some(2);
        d.status = Some(DeploymentStatus {
            observed_generation: Some(2),
            replicas: Some(total),
            ready_replicas: Some(ready),
            updated_replicas: Some(updated),
            ..Default::default()
        });
        let _ = desired;
        d
    }

    fn obs<'a>(dep: Option<&'a Deployment>, pods: &'a [Pod], desired: i32) -> Observed<'a> {
        Observed {
            generation: 3,
            digest: D,
            source: "src-now",
            desired,
            deployment: dep,
            pods,
            tenants: TenantsSecret::NotReferenced,
            scaling: Scaling {
                active: false,
                reason: "AutoscalingDisabled".into(),
                message: String::new(),
            },
            conflict: None,
            invalid_pod: None,
            served_name_conflict: None,
            now: Timestamp::UNIX_EPOCH,
            gpus_reserved: None,
            unschedulable: None,
        }
    }

    #[test]
    fn reserved_gpus_are_named_in_a_warning_condition() {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let r = |pairs: &[(&str, &str)]| k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            ),
            ..Default::default()
        };
        assert_eq!(gpus_reserved(None), None);
        assert_eq!(gpus_reserved(Some(&r(&[("cpu", "2"), ("memory", "4Gi")]))), None);
        assert_eq!(gpus_reserved(Some(&r(&[("nvidia.com/gpu", "0")]))), None);
        let named = gpus_reserved(Some(&r(&[("cpu", "2"), ("nvidia.com/gpu", "1")])));
        assert_eq!(named.as_deref(), Some("nvidia.com/gpu: 1"));
        let mut o = obs(None, &[], 1);
        o.gpus_reserved = named;
        let cs = conditions(&o);
        assert_eq!(get(&cs, GPU_UNUSED), ("True", "CPUEngine"));
        let c = cs.iter().find(|c| c.type_ == GPU_UNUSED).unwrap();
        assert!(
            c.message.contains("nvidia.com/gpu: 1") && c.message.contains("CPU only"),
            "{}",
            c.message
        );
        assert_eq!(
            get(&conditions(&obs(None, &[], 1)), GPU_UNUSED),
            ("False", "NoGPUReserved")
        );
    }

    fn get<'a>(cs: &'a [Condition], t: &str) -> (&'a str, &'a str) {
        let c = cs.iter().find(|c| c.type_ == t).unwrap();
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn digest_verdicts() {
        let bad = "DigestMismatch: digest mismatch for file:///m: expected a, got b";
        let cases: Vec<(Vec<Pod>, DigestVerdict)> = vec![
            (vec![], DigestVerdict::Pending),
            (vec![pod(D, None)], DigestVerdict::Pending),
            (vec![pod(D, Some((0, "")))], DigestVerdict::Verified),
            (
                vec![pod(D, Some((4, bad)))],
                DigestVerdict::Failed("DigestMismatch".into(), bad.into()),
            ),
            (vec![pod("sha256:old", Some((4, bad)))], DigestVerdict::Pending), // another revision's pod
            (
                vec![pod(D, Some((4, bad))), pod(D, Some((0, "")))],
                DigestVerdict::Verified,
            ),
            (
                vec![pod(D, Some((1, "panic at the disco")))],
                DigestVerdict::Failed("FetchFailed".into(), "panic at the disco".into()),
            ),
        ];
        for (pods, expected) in cases {
            assert_eq!(digest_verdict(&pods, D, "src-now"), expected);
        }
    }

    /// A pod with the source annotation counts by it: a new requirement (a signature) on the same
    /// digest is judged on the new pods only.
    #[test]
    fn verdicts_follow_the_model_source_not_only_the_digest() {
        let with_source = |source: &str, exit: (i32, &str)| {
            let mut p = pod(D, Some(exit));
            p.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(SOURCE_ANNOTATION.into(), source.into());
            p
        };
        let unsigned = "SignatureNotFound: oci://r/m@sha256:x: not signed";
        let pods = [
            with_source("src-old", (0, "")),
            with_source("src-now", (9, unsigned)),
        ];
        assert_eq!(
            digest_verdict(&pods, D, "src-now"),
            DigestVerdict::Failed("SignatureNotFound".into(), unsigned.into())
        );
        assert_eq!(digest_verdict(&pods, D, "src-old"), DigestVerdict::Verified);
    }

    #[test]
    fn ready_fleet() {
        let dep = deployment(2, 2, 2, 2);
        let pods = [pod(D, Some((0, "")))];
        let cs = conditions(&obs(Some(&dep), &pods, 2));
        assert_eq!(get(&cs, READY), ("True", "Ready"));
        assert_eq!(get(&cs, RECONCILING), ("False", "Idle"));
        assert_eq!(get(&cs, STALLED), ("False", "NotStalled"));
        assert_eq!(get(&cs, DIGEST_VERIFIED), ("True", "Verified"));
        assert_eq!(get(&cs, DEGRADED), ("False", "AsDesired"));
        assert!(cs.iter().all(|c| c.observed_generation == Some(3)));
    }

    #[test]
    fn rolling_out_and_scaling_up() {
        let dep = deployment(3, 1, 1, 1);
        let cs = conditions(&obs(Some(&dep), &[], 3));
        assert_eq!(get(&cs, READY), ("False", "Progressing"));
        assert_eq!(get(&cs, RECONCILING), ("True", "Progressing"));
        assert_eq!(get(&cs, DEGRADED), ("True", "BelowDesired"));
        let cs = conditions(&obs(None, &[], 1));
        assert_eq!(get(&cs, READY), ("False", "Creating"));
    }

    #[test]
    fn digest_mismatch_on_a_new_revision_stalls_while_old_pods_serve() {
        // The old ReplicaSet still has 2 ready pods; the new one's pod failed verification.
        let dep = deployment(2, 2, 1, 3);
        let pods = [pod(D, Some((4, "DigestMismatch: expected x, got y")))];
        let cs = conditions(&obs(Some(&dep), &pods, 2));
        assert_eq!(get(&cs, DIGEST_VERIFIED), ("False", "DigestMismatch"));
        assert_eq!(get(&cs, STALLED), ("True", "DigestMismatch"));
        assert_eq!(get(&cs, READY), ("False", "DigestMismatch"));
        assert_eq!(get(&cs, RECONCILING), ("False", "Idle"));
        assert_eq!(get(&cs, DEGRADED), ("True", "NewRevisionFailing"));
    }

    #[test]
    fn scaled_to_zero_is_ready_not_progressing() {
        let dep = deployment(0, 0, 0, 0);
        let cs = conditions(&obs(Some(&dep), &[], 0));
        assert_eq!(get(&cs, READY), ("True", "ScaledToZero"));
        assert_eq!(get(&cs, RECONCILING), ("False", "Idle"));
        assert_eq!(get(&cs, DEGRADED), ("False", "AsDesired"));
        // Pods still terminating: not yet.
        let dep = deployment(0, 1, 1, 1);
        assert_eq!(
            get(&conditions(&obs(Some(&dep), &[], 0)), READY),
            ("False", "Progressing")
        );
    }

    #[test]
    fn missing_tenants_secret_stalls() {
        let mut o = obs(None, &[], 1);
        o.tenants = TenantsSecret::Missing("keys".into());
        let cs = conditions(&o);
        assert_eq!(get(&cs, STALLED), ("True", "SecretNotFound"));
        o.tenants = TenantsSecret::MissingKey("keys".into(), "tenants.yaml".into());
        assert_eq!(get(&conditions(&o), STALLED), ("True", "SecretKeyNotFound"));
    }

    #[test]
    fn a_foreign_object_of_the_same_name_stalls_with_name_conflict() {
        let mut o = obs(None, &[], 1);
        o.conflict = Some(
            "Secret \"smollm2-admin-token\" already exists and is not controlled by this ModelDeployment"
                .into(),
        );
        o.tenants = TenantsSecret::Missing("keys".into());
        let cs = conditions(&o);
        assert_eq!(
            get(&cs, STALLED),
            ("True", "NameConflict"),
            "the conflict comes first"
        );
        assert_eq!(get(&cs, READY), ("False", "NameConflict"));
        assert_eq!(get(&cs, RECONCILING), ("False", "Idle"));
        let stalled = cs.iter().find(|c| c.type_ == STALLED).unwrap();
        assert!(
            stalled.message.contains("smollm2-admin-token"),
            "{}",
            stalled.message
        );
    }

    #[test]
    fn transition_times_only_move_on_transitions() {
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let t1 = Timestamp::from_second(1_800_000_100).unwrap();
        let dep = deployment(1, 1, 1, 1);
        let first = carry_transition_times(&[], conditions(&obs(Some(&dep), &[], 1)), t0);
        let again = carry_transition_times(&first, conditions(&obs(Some(&dep), &[], 1)), t1);
        assert_eq!(first, again, "an unchanged world gives an identical status");
        let scaled = deployment(2, 1, 1, 1);
        let next = carry_transition_times(&again, conditions(&obs(Some(&scaled), &[], 2)), t1);
        let ready = next.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(ready.last_transition_time, Time(t1));
        let stalled = next.iter().find(|c| c.type_ == STALLED).unwrap();
        assert_eq!(stalled.last_transition_time, Time(t0));
    }
}
