//! `spec.rollout` and `status.rollout`: how a new revision of a ModelDeployment reaches traffic.
//!
//! A revision is what the runtime pods run (model, digest, runtime settings): a change to it is a
//! new revision. With `strategy: Canary` the operator keeps the stable revision's pods serving, brings
//! the new revision's pods up beside them, and the gateway sends each step's `weight` percent of
//! requests to them. Each step is judged against stable over the `analysis` window; a failed judgement
//! rolls back at once. The operator's decisions live in `status.rollout`, never in `spec`, so GitOps
//! tools see no drift; manual `promote` and `abort` are annotations (see docs/rollouts.md).
//!
//! Ratios and rates are decimal strings (`"1.5"`), as prices are: exact in Git, no float round trips.

use crate::autoscaling::DURATION_PATTERN;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A non-negative decimal with at most 4 decimals.
pub const DECIMAL_PATTERN: &str = r"^[0-9]{1,6}(\.[0-9]{1,4})?$";

/// The runtime pod label carrying its revision (what the gateway splits traffic by). A runtime pod
/// without it belongs to the stable revision.
pub const REVISION_LABEL: &str = "modelfleet.io/revision";

/// Annotation that approves the canary past its manual gates (value: the canary revision; a value
/// naming another revision does nothing, so one left behind never approves a later rollout).
pub const PROMOTE_ANNOTATION: &str = "modelfleet.io/promote";
/// Annotation that aborts the rollout in progress (value: the canary revision).
pub const ABORT_ANNOTATION: &str = "modelfleet.io/abort";

/// How a change of revision reaches traffic.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.strategy) && self.strategy == 'Canary') || (has(self.steps) && size(self.steps) > 0)").message("rollout.steps needs at least one step with strategy Canary").field_path(".steps"))]
#[x_kube(validation = Rule::new("(has(self.strategy) && self.strategy == 'Canary') || (!has(self.steps) && !has(self.mirror) && !has(self.analysis))").message("rollout.steps, analysis and mirror go with strategy Canary only").field_path(".strategy"))]
#[x_kube(validation = Rule::new("!has(self.steps) || (self.steps.map(s, s.weight).isSorted() && self.steps.all(a, self.steps.exists_one(b, b.weight == a.weight)))").message("rollout.steps weights must increase from step to step").field_path(".steps"))]
pub struct RolloutSpec {
    /// `RollingUpdate` (the default: new pods take all traffic once Ready) or `Canary` (weighted steps,
    /// judged on live metrics, rolled back automatically).
    #[serde(default)]
    pub strategy: RolloutStrategy,
    /// The traffic steps, in order. After the last one passes, the canary becomes stable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub steps: Vec<RolloutStep>,
    /// What a step must show to pass. Defaults apply when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<RolloutAnalysis>,
    /// A shadow step before any client sees the canary: a share of stable's requests is copied to it,
    /// its answers discarded, and judged like a step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<MirrorSpec>,
}

/// `spec.rollout.strategy`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RolloutStrategy {
    /// The Deployment's rolling update: new pods take traffic as they become Ready.
    #[default]
    RollingUpdate,
    /// Weighted steps with analysis and automatic rollback.
    Canary,
}

/// One traffic step.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.pause) != has(self.gate)").message("a rollout step needs exactly one of pause (a duration) or gate: Manual").field_path(".pause"))]
pub struct RolloutStep {
    /// Percent of requests sent to the canary during this step (1–100).
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,
    /// How long the step lasts; the canary is judged over it and moves on when it passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = DURATION_PATTERN))]
    pub pause: Option<String>,
    /// `Manual`: the step holds until the `modelfleet.io/promote` annotation names the canary revision
    /// (a failed analysis still rolls back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<RolloutGate>,
}

/// A step that waits for a person.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutGate {
    /// Hold until promoted by annotation.
    Manual,
}

/// The thresholds a canary step is judged on, each against stable over the same window.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutAnalysis {
    /// Seconds of traffic each judgement covers (the analysis window).
    #[serde(default = "default_window")]
    #[schemars(range(min = 10, max = 3600))]
    pub window_seconds: i32,
    /// Requests the canary must have answered in the window before it is judged: with fewer the step
    /// waits (and never passes on too little evidence).
    #[serde(default = "default_min_requests")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub min_requests: i32,
    /// Percentage points the canary's error rate (5xx answers and broken streams) may exceed stable's,
    /// e.g. `"1"`: stable at 0.2 % allows the canary up to 1.2 %.
    #[serde(default = "default_error_points")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub max_error_rate_increase: String,
    /// Largest canary/stable ratio of p95 time to first token, e.g. `"1.5"`.
    #[serde(default = "default_ratio")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub max_ttft_p95_ratio: String,
    /// Largest canary/stable ratio of p95 inter-token latency, e.g. `"1.5"`.
    #[serde(default = "default_ratio")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub max_itl_p95_ratio: String,
}

impl Default for RolloutAnalysis {
    fn default() -> Self {
        Self {
            window_seconds: default_window(),
            min_requests: default_min_requests(),
            max_error_rate_increase: default_error_points(),
            max_ttft_p95_ratio: default_ratio(),
            max_itl_p95_ratio: default_ratio(),
        }
    }
}

fn default_window() -> i32 {
    60
}
fn default_min_requests() -> i32 {
    50
}
fn default_error_points() -> String {
    "1".into()
}
fn default_ratio() -> String {
    "1.5".into()
}

/// The shadow step.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MirrorSpec {
    /// Percent of stable's requests copied to the canary (1–100).
    #[schemars(range(min = 1, max = 100))]
    pub percent: i32,
    /// How long the shadow step lasts.
    #[schemars(length(max = 32), regex(pattern = DURATION_PATTERN))]
    pub pause: String,
}

/// Where a rollout stands (`status.rollout`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RolloutPhase {
    /// One revision serves everything.
    #[default]
    Stable,
    /// The canary's pods are starting; no traffic moved yet.
    Starting,
    /// The shadow step: the canary receives copies only.
    Mirroring,
    /// A traffic step is running.
    Progressing,
    /// A manual gate holds the step.
    Paused,
    /// The last step passed: stable's pods are being retired.
    Promoting,
    /// An analysis failed; the canary was withdrawn. Holds until the spec names another revision.
    RolledBack,
    /// Aborted by annotation; holds until the spec names another revision.
    Aborted,
}

/// The operator's rollout decisions, with the figures behind them.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The revision serving by default (a hash of the runtime pods' template).
    #[serde(default)]
    pub stable_revision: String,
    /// The revision being rolled out, while one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_revision: Option<String>,
    /// What the rollout is doing.
    #[serde(default)]
    pub phase: RolloutPhase,
    /// Index into `spec.rollout.steps` of the running step (absent in the shadow step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<i32>,
    /// Percent of requests the gateway sends to the canary now.
    #[serde(default)]
    pub weight: i32,
    /// Percent of stable's requests copied to the canary now.
    #[serde(default)]
    pub mirror_percent: i32,
    /// When the running step (or the current phase) began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started_at: Option<Time>,
    /// Each judged step's figures, oldest first (this rollout only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 12))]
    pub steps: Vec<StepAnalysis>,
    /// Why the rollout is where it is, in words (with the failing threshold and figures on rollback).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub message: String,
}

/// One step's judgement.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct StepAnalysis {
    /// Step index (`-1` for the shadow step).
    pub step: i32,
    /// The canary's weight (or mirror percent) during it.
    pub weight: i32,
    /// `Passed` or `Failed`.
    pub verdict: String,
    /// Requests each revision answered in the window.
    pub canary_requests: i64,
    pub stable_requests: i64,
    /// Error rates in percent, 2 decimals.
    pub canary_error_percent: String,
    pub stable_error_percent: String,
    /// Canary/stable p95 ratios, 3 significant digits (absent without latency samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_p95_ratio: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_p95_ratio: Option<String>,
    /// When it was judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Time>,
}
