//! `status.starting`: the runtime pods that are starting now — scheduled, pulling the model, checking
//! it, loading it — each with its phase and, while bytes move, how many, how fast and how long to go.
//! `status.startingSummary` says it in one line for `kubectl get md` (the `Starting` column).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most pods listed in `status.starting`.
pub const MAX_STARTING: usize = 16;

/// One starting pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodStart {
    /// The pod's name.
    pub pod: String,
    /// `Scheduling`, `Unschedulable`, `ImagePull` (the node pulls the runtime image or the model's
    /// image volume), `Signature`, `Pull`, `Verify`, `Install` (the fetch container's phases), `Load`
    /// (the runtime loads and checks the model), or `Failed`.
    pub phase: String,
    /// Bytes pulled so far (`Pull`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<i64>,
    /// Bytes the model has, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<i64>,
    /// Average rate of the pull so far, bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<i64>,
    /// Seconds left at that rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<i64>,
    /// What holds it, when something does (the scheduler's message, an image pull error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
