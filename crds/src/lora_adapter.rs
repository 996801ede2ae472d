//! `LoraAdapter`: a LoRA adapter pinned by content digest, hot-loaded onto every ready replica of one
//! `ModelDeployment`, usable by the tenants it lists (all of the deployment's tenants when empty).

use crate::common::{DIGEST_PATTERN, OBJECT_NAME_PATTERN, SERVED_NAME_PATTERN, URI_PATTERN};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of an adapter.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "modelfleet.io",
    version = "v1alpha1",
    kind = "LoraAdapter",
    namespaced,
    status = "LoraAdapterStatus",
    shortname = "lora",
    category = "modelfleet",
    doc = "A LoRA adapter pinned by content digest, loaded onto every replica of a ModelDeployment",
    printcolumn(name = "Base", type_ = "string", json_path = ".spec.modelDeploymentRef.name"),
    printcolumn(name = "Served", type_ = "string", json_path = ".spec.servedName"),
    printcolumn(name = "Loaded", type_ = "integer", json_path = ".status.loadedReplicas"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".status.desiredReplicas"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct LoraAdapterSpec {
    /// The ModelDeployment (same namespace) whose replicas serve this adapter. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("modelDeploymentRef is immutable: create a new LoraAdapter instead"))]
    pub model_deployment_ref: ModelDeploymentRef,
    /// The name clients put in `model`. Defaults to the LoraAdapter's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = SERVED_NAME_PATTERN))]
    pub served_name: Option<String>,
    /// `file:///path`, `http(s)://…` or `hf://org/repo@revision` of a PEFT adapter directory.
    #[schemars(length(min = 1, max = 2048), regex(pattern = URI_PATTERN))]
    pub uri: String,
    /// Canonical content digest the adapter's bytes must match: `sha256:<64 hex>`.
    #[schemars(regex(pattern = DIGEST_PATTERN))]
    pub digest: String,
    /// Tenant ids allowed to use the adapter; empty means every tenant of the deployment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    #[schemars(length(max = 256), inner(length(min = 1, max = 253)))]
    pub tenants: Vec<String>,
}

/// Reference to a ModelDeployment in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentRef {
    /// Name of the ModelDeployment.
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
}

/// Observed state of an adapter.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LoraAdapterStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Verified` (digest and compatibility) and `Ready` (loaded on every ready replica), plus kstatus'
    /// `Reconciling` and `Stalled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[schemars(length(max = 16))]
    pub conditions: Vec<Condition>,
    /// Ready replicas that have the adapter loaded.
    #[serde(default)]
    pub loaded_replicas: i32,
    /// Ready replicas of the base deployment.
    #[serde(default)]
    pub desired_replicas: i32,
    /// Per-pod state (bounded: the first 64 pods by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["pod".into()]))]
    #[schemars(length(max = 64))]
    pub pods: Vec<PodAdapterState>,
}

/// Where an adapter stands on one pod.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterPodPhase {
    /// Being fetched, verified and loaded.
    Loading,
    /// Servable.
    Loaded,
    /// The pod refused or failed to load it (see `message`).
    Failed,
    /// Being unloaded.
    Unloading,
}

/// An adapter's state on one pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodAdapterState {
    /// Pod name.
    pub pod: String,
    /// Where the adapter stands on that pod.
    pub state: AdapterPodPhase,
    /// Why, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// When `state` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}
