//! `spec.fallback`: where the fleet gateway sends a request this deployment cannot start in time —
//! an ordered list of other ModelDeployments, each with the triggers it takes. A request moves only
//! before a byte of its answer reached the client (docs/gateway.md, "Fallbacks").

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default `noReadyReplicaWaitSeconds`.
pub const DEFAULT_NO_READY_REPLICA_WAIT_SECONDS: i32 = 1;

/// Why a request moves to a fallback.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FallbackTrigger {
    /// The deployment had no Ready replica for `noReadyReplicaWaitSeconds` (scaling from zero, or
    /// every pod gone).
    NoReadyReplica,
    /// Every replica tried refused the request for load: a full queue (429 `queue_full`), or draining
    /// and not ready (503).
    Saturated,
    /// No first token within the first-token deadline (`firstTokenDeadlineMilliseconds`, or the
    /// caller's shorter `x-modelfleet-first-token-deadline-ms`): the pod gave the request up before
    /// a byte of the answer was sent.
    FirstTokenDeadline,
}

impl FallbackTrigger {
    /// Every trigger (what an empty `triggers` means).
    pub const ALL: [FallbackTrigger; 3] = [
        FallbackTrigger::NoReadyReplica,
        FallbackTrigger::Saturated,
        FallbackTrigger::FirstTokenDeadline,
    ];

    /// The metric label and span attribute value.
    pub fn label(self) -> &'static str {
        match self {
            FallbackTrigger::NoReadyReplica => "no_ready_replica",
            FallbackTrigger::Saturated => "saturated",
            FallbackTrigger::FirstTokenDeadline => "first_token_deadline",
        }
    }
}

/// One place a request may move to.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FallbackTarget {
    /// Another ModelDeployment in the same namespace (e.g. a smaller model). It must accept the
    /// caller's API key as the same tenant, or the request does not move there.
    #[schemars(length(min = 1, max = 253))]
    pub model_deployment: String,
    /// The triggers this target takes (default: every one). (Not `on`: YAML 1.1 readers such as
    /// kubectl's take a bare `on` key for the boolean `true`.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub triggers: Vec<FallbackTrigger>,
}

impl FallbackTarget {
    /// Whether this target takes requests moved for `trigger`.
    pub fn takes(&self, trigger: FallbackTrigger) -> bool {
        self.triggers.is_empty() || self.triggers.contains(&trigger)
    }
}

/// The deployment's fallbacks, tried in order.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FallbackSpec {
    /// How long a request waits for a Ready replica before it moves (`NoReadyReplica`); the wait
    /// goes on as before when no target takes that trigger. Default 1.
    #[serde(default = "default_wait")]
    #[schemars(range(min = 0, max = 600))]
    pub no_ready_replica_wait_seconds: i32,
    /// How long a request may go without its first token on this deployment before it moves
    /// (`FirstTokenDeadline`), counted from its arrival at the gateway; a caller may only shorten it
    /// (`x-modelfleet-first-token-deadline-ms`). Unset: no deadline unless the caller sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600000))]
    pub first_token_deadline_milliseconds: Option<i32>,
    /// The targets, first first.
    #[schemars(length(min = 1, max = 4))]
    pub targets: Vec<FallbackTarget>,
}

fn default_wait() -> i32 {
    DEFAULT_NO_READY_REPLICA_WAIT_SECONDS
}
