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

/// One place a request may move to: another ModelDeployment, or an external OpenAI-compatible
/// provider — exactly one of the two.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.modelDeployment) != has(self.provider)").message("a fallback target names exactly one of modelDeployment and provider").field_path(".modelDeployment"))]
pub struct FallbackTarget {
    /// Another ModelDeployment in the same namespace (e.g. a smaller model). It must accept the
    /// caller's API key as the same tenant, or the request does not move there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub model_deployment: Option<String>,
    /// An external OpenAI-compatible API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderTarget>,
    /// The triggers this target takes (default: every one). (Not `on`: YAML 1.1 readers such as
    /// kubectl's take a bare `on` key for the boolean `true`.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub triggers: Vec<FallbackTrigger>,
}

/// Default `provider.timeoutSeconds`.
pub const DEFAULT_PROVIDER_TIMEOUT_SECONDS: i32 = 60;

/// An external OpenAI-compatible provider as a fallback: the request goes there with the provider's
/// model name and the provider's key (never the caller's), and is priced with the provider's prices.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProviderTarget {
    /// Its name in metrics, usage records (`provider:<name>`) and `x-modelfleet-served-by`.
    #[schemars(length(min = 1, max = 63), regex(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// The API's base URL up to its version, e.g. `https://api.openai.com/v1`: the request's path
    /// after `/v1` is appended (`/chat/completions`, `/completions`).
    #[schemars(length(min = 8, max = 2048), regex(pattern = "^https?://[^\\s]+$"))]
    pub base_url: String,
    /// The provider's name of the model to ask (the request's `model` becomes this).
    #[schemars(length(min = 1, max = 256))]
    pub model: String,
    /// The Secret key holding the provider's API key, sent as `Authorization: Bearer …`. Without it
    /// no `Authorization` is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<ProviderKeyRef>,
    /// Seconds the provider has for an answer's first byte, and between its bytes (default 60).
    #[serde(default = "default_provider_timeout")]
    #[schemars(range(min = 1, max = 600))]
    pub timeout_seconds: i32,
    /// Price per million prompt tokens (decimal string, in the deployment's `spec.cost.currency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,12}(\.[0-9]{1,6})?$"))]
    pub input_per_million_tokens: Option<String>,
    /// Price per million cached prompt tokens (default: the input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,12}(\.[0-9]{1,6})?$"))]
    pub cached_input_per_million_tokens: Option<String>,
    /// Price per million completion tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,12}(\.[0-9]{1,6})?$"))]
    pub output_per_million_tokens: Option<String>,
}

fn default_provider_timeout() -> i32 {
    DEFAULT_PROVIDER_TIMEOUT_SECONDS
}

/// A key of a Secret in the deployment's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct ProviderKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key inside it (default `apiKey`).
    #[serde(default = "default_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_key() -> String {
    "apiKey".into()
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
