//! LoraAdapter status as a pure function of what a pass observed (the base deployment, a served-name
//! conflict, each ready pod's load outcome) and the previous status.
//!
//! Invariants: `pods[]` holds at most [`MAX_PODS`] entries (the first by name) while the counts cover
//! every ready pod; a pod's `lastTransitionTime` and a condition's change only when its state does;
//! a pass that learned nothing new about a pod (its call is still in flight, e.g. after a leader change
//! or during a periodic re-check) keeps that pod's previous entry and the previous `Verified` verdict
//! for the same generation, so an unchanged world gives an identical status (no write, no Event).

use super::admin::{AdminError, Reason};
use super::desired::Conflict;
use crate::status::carry_transition_times;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use modelfleet_crds::condition_types::{READY, RECONCILING, STALLED, VERIFIED};
use modelfleet_crds::lora_adapter::{AdapterPodPhase, LoraAdapterStatus, PodAdapterState};

/// Most pods listed in `status.pods` (the CRD's bound).
pub const MAX_PODS: usize = 64;

/// What this pass knows about the adapter on one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodLoad {
    /// A call is in flight or about to start, and no earlier outcome for this spec is known.
    InFlight,
    /// Loaded (the runtime answered 200 or 201).
    Loaded,
    /// The last load failed.
    Failed(AdminError),
    /// Deletion: still to be unloaded (with the last failure, if any).
    Unloading(Option<String>),
    /// Deletion: the unload gave up on this pod.
    UnloadFailed(String),
}

/// Everything one pass observed.
#[derive(Clone, Debug)]
pub struct Observed {
    /// `metadata.generation`.
    pub generation: i64,
    /// `spec.modelDeploymentRef.name`.
    pub deployment: String,
    /// `spec.digest`.
    pub digest: String,
    /// Whether the ModelDeployment exists.
    pub base_found: bool,
    /// Why the adapter may not use its served name, if it may not.
    pub conflict: Option<Conflict>,
    /// The admin-token Secret is missing (no calls can be made).
    pub token_missing: bool,
    /// Being deleted.
    pub deleting: bool,
    /// Ready pods (when deleting: pods still to be unloaded), sorted by name.
    pub pods: Vec<(String, PodLoad)>,
}

fn condition(type_: &str, status: &str, reason: &str, message: String, generation: i64) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: Some(generation),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

/// A pod's entry and, when it failed, the reason (unknown for an entry carried over).
struct Entry {
    state: PodAdapterState,
    failure: Option<Option<Reason>>,
}

fn entries(obs: &Observed, previous: &LoraAdapterStatus) -> Vec<Entry> {
    let same_generation = previous.observed_generation == Some(obs.generation);
    obs.pods
        .iter()
        .map(|(pod, load)| {
            let make = |state, message: Option<String>, failure| Entry {
                state: PodAdapterState {
                    pod: pod.clone(),
                    state,
                    message,
                    last_transition_time: None,
                },
                failure,
            };
            match load {
                PodLoad::Loaded => make(AdapterPodPhase::Loaded, None, None),
                PodLoad::Failed(e) => make(
                    AdapterPodPhase::Failed,
                    Some(e.message.clone()),
                    Some(Some(e.reason)),
                ),
                PodLoad::Unloading(m) => make(AdapterPodPhase::Unloading, m.clone(), None),
                PodLoad::UnloadFailed(m) => make(AdapterPodPhase::Failed, Some(m.clone()), None),
                PodLoad::InFlight => {
                    let before = previous
                        .pods
                        .iter()
                        .find(|p| &p.pod == pod)
                        .filter(|_| same_generation);
                    match before {
                        Some(p) if p.state == AdapterPodPhase::Loaded => {
                            make(AdapterPodPhase::Loaded, None, None)
                        }
                        Some(p) if p.state == AdapterPodPhase::Failed && !obs.deleting => {
                            make(AdapterPodPhase::Failed, p.message.clone(), Some(None))
                        }
                        _ => make(AdapterPodPhase::Loading, None, None),
                    }
                }
            }
        })
        .collect()
}

/// The conditions: `Verified`, `Ready`, `Reconciling`, `Stalled` (transition times still to carry).
fn conditions(obs: &Observed, previous: &LoraAdapterStatus, entries: &[Entry]) -> Vec<Condition> {
    let g = obs.generation;
    let ready_pods = entries.len();
    let loaded = entries
        .iter()
        .filter(|e| e.state.state == AdapterPodPhase::Loaded)
        .count();
    let failure_of = |verification: bool| {
        entries.iter().find_map(|e| match e.failure {
            Some(Some(r)) if r.is_verification() == verification => Some((r, e)),
            Some(None) if !verification => Some((Reason::LoadFailed, e)),
            _ => None,
        })
    };
    let say = |e: &Entry| {
        format!(
            "pod {}: {}",
            e.state.pod,
            e.state.message.clone().unwrap_or_default()
        )
    };
    let previous_verified = previous
        .conditions
        .iter()
        .find(|c| c.type_ == VERIFIED && c.observed_generation == Some(g))
        .cloned();

    let verified = if obs.conflict.is_some() {
        condition(
            VERIFIED,
            "Unknown",
            "NameConflict",
            "not loaded: its served name is taken".into(),
            g,
        )
    } else if !obs.base_found {
        condition(
            VERIFIED,
            "Unknown",
            "BaseModelNotFound",
            format!("ModelDeployment {:?} not found", obs.deployment),
            g,
        )
    } else if let Some((reason, e)) = failure_of(true) {
        condition(VERIFIED, "False", reason.as_str(), say(e), g)
    } else if loaded > 0 {
        condition(
            VERIFIED,
            "True",
            "Verified",
            format!("the bytes match {} and fit the base model", obs.digest),
            g,
        )
    } else if let Some(c) = previous_verified {
        c // nothing new learned: keep the verdict for this generation
    } else {
        condition(
            VERIFIED,
            "Unknown",
            "Pending",
            "no pod has loaded the adapter yet".into(),
            g,
        )
    };

    let counts = format!("loaded on {loaded}/{ready_pods} ready replicas");
    let (ready_status, reason, message) = if obs.deleting {
        (
            "False",
            "Deleting".to_string(),
            format!("unloading from {} pods", entries.len()),
        )
    } else if let Some(conflict) = &obs.conflict {
        ("False", "NameConflict".into(), conflict.message(&obs.deployment))
    } else if !obs.base_found {
        ("False", "BaseModelNotFound".into(), verified.message.clone())
    } else if verified.status == "False" {
        ("False", verified.reason.clone(), verified.message.clone())
    } else if obs.token_missing {
        (
            "False",
            "Loading".into(),
            format!("waiting for the admin-token Secret of {:?}", obs.deployment),
        )
    } else if ready_pods == 0 {
        (
            "False",
            "NoReadyReplicas".into(),
            format!("ModelDeployment {:?} has no ready replicas", obs.deployment),
        )
    } else if loaded == ready_pods {
        ("True", "Loaded".into(), counts)
    } else if let Some((_, e)) = failure_of(false) {
        ("False", "LoadFailed".into(), format!("{counts}; {}", say(e)))
    } else {
        ("False", "Loading".into(), counts)
    };
    let stalled = matches!(
        reason.as_str(),
        "NameConflict" | "BaseModelNotFound" | "DigestMismatch" | "Incompatible"
    );
    let ready = condition(READY, ready_status, &reason, message.clone(), g);
    let reconciling = if ready_status == "False" && !stalled {
        condition(RECONCILING, "True", &reason, message.clone(), g)
    } else {
        condition(RECONCILING, "False", "Idle", String::new(), g)
    };
    let stalled = if stalled {
        condition(STALLED, "True", &reason, message, g)
    } else {
        condition(STALLED, "False", "NotStalled", String::new(), g)
    };
    vec![ready, verified, reconciling, stalled]
}

/// The status for `obs`, carrying transition times over from `previous`.
pub fn build(obs: &Observed, previous: &LoraAdapterStatus, now: Timestamp) -> LoraAdapterStatus {
    let entries = entries(obs, previous);
    let conditions = carry_transition_times(&previous.conditions, conditions(obs, previous, &entries), now);
    let (loaded, desired) = if obs.deleting {
        (entries.len() as i32, 0)
    } else {
        let loaded = entries
            .iter()
            .filter(|e| e.state.state == AdapterPodPhase::Loaded)
            .count();
        (loaded as i32, entries.len() as i32)
    };
    let pods = entries
        .into_iter()
        .take(MAX_PODS)
        .map(|e| {
            let mut p = e.state;
            p.last_transition_time = match previous.pods.iter().find(|q| q.pod == p.pod) {
                Some(q) if q.state == p.state => q.last_transition_time.clone(),
                _ => Some(Time(now)),
            };
            p
        })
        .collect();
    LoraAdapterStatus {
        observed_generation: Some(obs.generation),
        conditions,
        loaded_replicas: loaded,
        desired_replicas: desired,
        pods,
    }
}

#[cfg(test)]
mod tests;
