//! `ModelDeployment`: a model pinned by content digest, served by a fleet of runtime pods.
//!
//! The spec is what a platform team keeps in Git; the status is recomputed by the operator from what
//! it observes. The autoscaler's decision lives in `status.desiredReplicas` — never in the spec — so
//! GitOps tools see no drift. The `scale` subresource maps to `spec.replicas` / `status.replicas` /
//! `status.selector` so `kubectl scale`, HPA and KEDA can drive a deployment in `External` mode.

pub use crate::autoscaling::{Objectives, ObjectivesStatus, ScheduleWindow};
use crate::common::{DIGEST_PATTERN, SecretKeyRef};
pub use crate::fallback::{FallbackSpec, FallbackTarget, FallbackTrigger};
pub use crate::model_source::{
    Delivery, ModelSource, ObjectRef, OciSettings, PublicKeyRef, S3Settings, VerifySpec,
};
pub use crate::rollout::{RolloutSpec, RolloutStatus};
use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of a model fleet.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "modelfleet.io",
    version = "v1alpha1",
    kind = "ModelDeployment",
    namespaced,
    status = "ModelDeploymentStatus",
    shortname = "md",
    category = "modelfleet",
    doc = "A model pinned by content digest and served by a fleet of modelfleet-runtime pods",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model.servedName"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".status.desiredReplicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Queue", type_ = "integer", json_path = ".status.observedMetrics.queueDepth"),
    printcolumn(name = "KV %", type_ = "integer", json_path = ".status.observedMetrics.kvCacheUtilizationPercent"),
    printcolumn(name = "TTFT p95", type_ = "string", json_path = ".status.objectives.ttftP95"),
    printcolumn(name = "ITL p95", type_ = "string", json_path = ".status.objectives.itlP95"),
    printcolumn(name = "Stable", type_ = "string", json_path = ".status.rollout.stableRevision", priority = 1),
    printcolumn(name = "Canary", type_ = "string", json_path = ".status.rollout.canaryRevision"),
    printcolumn(name = "Weight", type_ = "integer", json_path = ".status.rollout.weight"),
    printcolumn(name = "Step", type_ = "integer", json_path = ".status.rollout.step"),
    printcolumn(name = "Cost/Mtok", type_ = "string", json_path = ".status.capacity.costPerMillionOutputTokens.observed"),
    printcolumn(name = "Starting", type_ = "string", json_path = ".status.startingSummary"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new(
        "!has(self.spec.autoscaling) || self.spec.autoscaling.mode != 'Builtin' || !has(self.spec.replicas)"
    ).message(
        "spec.replicas must not be set while spec.autoscaling.mode is Builtin: the built-in autoscaler owns the \
         replica count (set mode External or Disabled to choose replicas yourself)"
    ).field_path(".spec.replicas")
)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentSpec {
    /// The model artifact: where it comes from and the digest its bytes must match.
    pub model: ModelSource,
    /// How each runtime pod is run and sized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeSpec>,
    /// Fixed replica count. Forbidden while `autoscaling.mode` is `Builtin`; in `External` mode this is
    /// what HPA or KEDA writes through the `scale` subresource. Defaults to 1 when nothing sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: Option<i32>,
    /// Replica autoscaling from queue depth, KV-cache pressure and latency objectives, within schedule
    /// windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,
    /// API keys → tenant ids: a Secret key holding the runtime's tenants file. It is mounted, not copied,
    /// so rotating the Secret rotates keys without a restart. Without it the fleet runs single-tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<TenantsSpec>,
    /// What a replica costs: with it the operator measures throughput and reports the cost per million
    /// output tokens in `status.capacity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostSpec>,
    /// How a new revision (a changed model, digest or runtime setting) reaches traffic: the default
    /// rolling update, or canary steps judged on live metrics with automatic rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,
    /// Where the fleet gateway sends a request this deployment cannot start in time: other
    /// ModelDeployments, in order, each for the triggers it lists. Requests move only before the first
    /// byte of their answer, and never further than one list (a fallback's own fallbacks are not used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackSpec>,
}

/// The price of serving: per replica-hour for `status.capacity`, per million tokens for what tenants
/// are charged (the gateway's spend budgets and usage records).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.pricePerReplicaHour) || has(self.inputPerMillionTokens) || has(self.cachedInputPerMillionTokens) || has(self.outputPerMillionTokens)").message("spec.cost needs at least one price: pricePerReplicaHour, inputPerMillionTokens, cachedInputPerMillionTokens or outputPerMillionTokens"))]
pub struct CostSpec {
    /// Price of one replica for one hour, as a decimal string (e.g. "2.50"): a node's or GPU's hourly
    /// price divided by the replicas it holds. Without it `status.capacity` is not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,12}(\.[0-9]{1,9})?$"))]
    pub price_per_replica_hour: Option<String>,
    /// Price a tenant is charged per million prompt tokens not served from the prefix cache (decimal
    /// string, at most 6 decimals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,12}(\.[0-9]{1,6})?$"))]
    pub input_per_million_tokens: Option<String>,
    /// Price per million prompt tokens served from the prefix cache (default: the input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,12}(\.[0-9]{1,6})?$"))]
    pub cached_input_per_million_tokens: Option<String>,
    /// Price per million completion tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,12}(\.[0-9]{1,6})?$"))]
    pub output_per_million_tokens: Option<String>,
    /// ISO 4217 currency code of the price (and of the reported costs).
    #[serde(default = "default_currency")]
    #[schemars(regex(pattern = "^[A-Z]{3}$"))]
    pub currency: String,
    /// Seconds of history the measured figures cover.
    #[serde(default = "default_cost_window")]
    #[schemars(range(min = 60, max = 86400))]
    pub window_seconds: i32,
}

/// Runtime pod settings. Every field is optional; the runtime's defaults apply.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSpec {
    /// Container image of `modelfleet-runtime`. Defaults to the operator's configured image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,
    /// CPU and memory requests and limits of the runtime container. The engine runs on CPU only in
    /// this release: an accelerator named here (`nvidia.com/gpu`) is reserved on the node and unused,
    /// and the `GPUUnused` condition says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Compute threads per pod (several pods may share a node). Defaults to the CPU limit, else all cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub threads: Option<i32>,
    /// Longest context (prompt + completion) in tokens. Defaults to the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 1048576))]
    pub max_model_len: Option<i32>,
    /// Most sequences in one engine step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_num_seqs: Option<i32>,
    /// Token budget of one engine step (decode tokens plus prefill chunks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 1048576))]
    pub max_num_batched_tokens: Option<i32>,
    /// Admission caps: requests beyond these are answered 429 at once, never queued without bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueSpec>,
    /// Paged KV-cache sizing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCacheSpec>,
    /// Prefix caching of full KV blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_caching: Option<PrefixCachingSpec>,
    /// LoRA residency limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraLimitsSpec>,
    /// Speculative decoding (the runtime's `--speculative-config`): n-gram prompt lookup, or a draft
    /// model fetched and verified by digest like the model itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative_config: Option<SpeculativeConfigSpec>,
    /// Extra `modelfleet-runtime serve` flags, appended after the ones the operator sets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub extra_args: Vec<String>,
    /// Extra environment variables of the runtime container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub env: Vec<EnvVar>,
    /// Where the pods run and what else they carry (`nodeSelector`, `tolerations`, `affinity`, …,
    /// `podTemplate`): [`crate::placement`].
    #[serde(flatten)]
    pub pod: crate::placement::PodSettings,
}

/// Bounded admission queue per pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    /// Most requests waiting (all tenants) before new ones get 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_num_queued_reqs: Option<i32>,
    /// Most prompt tokens waiting (all tenants) before new requests get 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000000))]
    pub max_num_queued_tokens: Option<i64>,
}

/// Paged KV-cache sizing.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct KvCacheSpec {
    /// Tokens per KV block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in [8, 16, 32, 64, 128]").message("blockSize must be one of 8, 16, 32, 64, 128"))]
    pub block_size: Option<i32>,
    /// Number of KV blocks. Defaults to what fits the pod's memory after the weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16777216))]
    pub num_blocks: Option<i32>,
    /// How each cached key and value is stored (the runtime's `--kv-cache-dtype`): `f32` (the default)
    /// keeps what the model computed, `f16` halves the pool's bytes per token, `q8_0` (8-bit with an
    /// f16 scale per head vector) holds about 1.9× the tokens of `f16` in the same memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<KvCacheDtype>,
}

/// The KV cache's element type.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCacheDtype {
    /// 32-bit floats.
    #[serde(rename = "f32")]
    F32,
    /// IEEE half precision.
    #[serde(rename = "f16")]
    F16,
    /// 8-bit integers, one f16 scale per head vector.
    #[serde(rename = "q8_0")]
    Q8_0,
}

impl KvCacheDtype {
    /// The runtime's `--kv-cache-dtype` value.
    pub fn flag(self) -> &'static str {
        match self {
            KvCacheDtype::F32 => "float32",
            KvCacheDtype::F16 => "float16",
            KvCacheDtype::Q8_0 => "q8_0",
        }
    }
}

/// Who may share cached prefixes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PrefixCacheScope {
    /// Cached prefixes are reused only by the tenant that produced them (the default).
    #[default]
    Tenant,
    /// All tenants of this deployment share cached prefixes; must be chosen explicitly.
    Deployment,
}

/// Prefix caching of full KV blocks.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PrefixCachingSpec {
    /// Turn prefix caching on or off.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Who may share cached prefixes.
    #[serde(default)]
    pub scope: PrefixCacheScope,
}

/// LoRA residency limits of each pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LoraLimitsSpec {
    /// Most adapters active in one engine step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub max_loras: Option<i32>,
    /// Most adapters kept in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_cpu_loras: Option<i32>,
    /// Highest adapter rank accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 512))]
    pub max_lora_rank: Option<i32>,
}

/// How speculative decoding proposes tokens.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SpeculativeMethod {
    /// Prompt lookup: the continuation of the longest recent n-gram match in the request's own tokens.
    #[default]
    Ngram,
    /// A smaller model with the same tokenizer (`draftModel`).
    DraftModel,
}

/// Speculative decoding. Outputs keep the model's distribution exactly (greedy outputs are unchanged);
/// only speed changes — measure it on your workload (docs/benchmarks.md).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(self.method == 'DraftModel') == has(self.draftModel)").message("speculativeConfig.draftModel is required with method DraftModel, and only with it"))]
#[x_kube(validation = Rule::new("self.method == 'Ngram' || (!has(self.promptLookupMin) && !has(self.promptLookupMax))").message("speculativeConfig.promptLookupMin/Max go with method Ngram only"))]
#[x_kube(validation = Rule::new("!has(self.promptLookupMin) || !has(self.promptLookupMax) || self.promptLookupMin <= self.promptLookupMax").message("speculativeConfig.promptLookupMin must be <= promptLookupMax"))]
pub struct SpeculativeConfigSpec {
    /// How tokens are proposed.
    #[serde(default)]
    pub method: SpeculativeMethod,
    /// Tokens proposed per sequence and step.
    #[schemars(range(min = 1, max = 16))]
    pub num_speculative_tokens: i32,
    /// Shortest n-gram looked up (`Ngram`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub prompt_lookup_min: Option<i32>,
    /// Longest n-gram looked up (`Ngram`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub prompt_lookup_max: Option<i32>,
    /// Steps with at least this many running requests do not speculate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub disable_by_batch_size: Option<i32>,
    /// A sequence whose recent acceptance falls below this stops speculating for a while (0 never stops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_acceptance_rate: Option<f64>,
    /// The draft model (`DraftModel`): fetched and verified by digest into the pod like the model. It
    /// must have the model's tokenizer (checked at start-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<DraftModelSource>,
}

/// A draft model artifact pinned by content digest.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DraftModelSource {
    /// `file:///path`, `http(s)://…`, `hf://org/repo@revision`, `oci://…@sha256:…` (fetched) or
    /// `s3://bucket/prefix` (with the model's `s3` settings and credentials).
    #[schemars(length(min = 1, max = 2048), regex(pattern = crate::common::DRAFT_URI_PATTERN))]
    pub uri: String,
    /// Canonical content digest the fetched bytes must match: `sha256:<64 hex>`.
    #[schemars(regex(pattern = DIGEST_PATTERN))]
    pub digest: String,
}

/// Who decides the replica count.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AutoscalingMode {
    /// The operator's autoscaler, from queue depth and KV-cache pressure; decisions in `status.desiredReplicas`.
    #[default]
    Builtin,
    /// HPA or KEDA drives `spec.replicas` through the `scale` subresource; the operator follows it.
    External,
    /// `spec.replicas` as written.
    Disabled,
}

/// Replica autoscaling.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("autoscaling.minReplicas must be <= autoscaling.maxReplicas").field_path(".minReplicas"))]
pub struct AutoscalingSpec {
    /// Who decides the replica count.
    #[serde(default)]
    pub mode: AutoscalingMode,
    /// Fewest replicas (`Builtin` mode). 0 lets an idle deployment scale to zero: requests through the
    /// gateway then wait while the operator scales it back to 1 (see `scaleToZeroAfterSeconds`).
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub min_replicas: i32,
    /// Most replicas (`Builtin` mode).
    #[serde(default = "default_max_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: i32,
    /// Waiting requests per replica the autoscaler aims for. Default 4 without `objectives`; with
    /// `objectives`, applied only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub target_queue_depth_per_replica: Option<i32>,
    /// Mean KV-cache utilisation (0–1] the autoscaler aims for. Default 0.8 without `objectives`;
    /// with `objectives`, applied only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.05, max = 1.0))]
    pub target_kv_cache_utilization: Option<f64>,
    /// Latency objectives (p95 time to first token, p95 inter-token latency): the autoscaler sizes the
    /// fleet from a capacity model of one replica to meet them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objectives: Option<Objectives>,
    /// Recurring windows with their own replica bounds (e.g. at most 1 replica at night, at least 4 on
    /// weekday mornings); they bound whatever the targets and objectives recommend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub schedule: Vec<ScheduleWindow>,
    /// Seconds a higher recommendation must hold before scaling up (the queue and KV targets'; the
    /// latency objectives' own count scales up at once).
    #[serde(default = "default_scale_up_window")]
    #[schemars(range(min = 0, max = 3600))]
    pub scale_up_stabilization_seconds: i32,
    /// Seconds of consistently lower recommendations before scaling down.
    #[serde(default = "default_scale_down_window")]
    #[schemars(range(min = 0, max = 86400))]
    pub scale_down_stabilization_seconds: i32,
    /// With `minReplicas: 0`: seconds without pending, running or arriving requests before the
    /// deployment goes to 0 replicas (its own window, independent of the scale-down window).
    #[serde(default = "default_scale_to_zero_after")]
    #[schemars(range(min = 1, max = 604800))]
    pub scale_to_zero_after_seconds: i32,
    /// Where the autoscaler reads per-replica metrics.
    #[serde(default)]
    pub metrics: MetricsSourceSpec,
}

impl AutoscalingSpec {
    /// The queue target in force: as set, or 4 when neither it nor `objectives` is set.
    pub fn queue_target(&self) -> Option<i32> {
        self.target_queue_depth_per_replica
            .or(self.objectives.is_none().then_some(DEFAULT_TARGET_QUEUE_DEPTH))
    }

    /// The KV-cache target in force: as set, or 0.8 when neither it nor `objectives` is set.
    pub fn kv_target(&self) -> Option<f64> {
        self.target_kv_cache_utilization
            .or(self.objectives.is_none().then_some(DEFAULT_TARGET_KV))
    }
}

/// `targetQueueDepthPerReplica` without objectives.
pub const DEFAULT_TARGET_QUEUE_DEPTH: i32 = 4;
/// `targetKvCacheUtilization` without objectives.
pub const DEFAULT_TARGET_KV: f64 = 0.8;

/// Where metrics come from.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MetricsSource {
    /// Scrape each ready pod's `/metrics` directly; no Prometheus needed.
    #[default]
    Direct,
    /// PromQL over the Prometheus HTTP API.
    Prometheus,
}

/// Metrics source of the autoscaler.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.source != 'Prometheus' || has(self.prometheus)").message("metrics.prometheus.url is required when metrics.source is Prometheus").field_path(".prometheus"))]
pub struct MetricsSourceSpec {
    /// `Direct` (default) or `Prometheus`.
    #[serde(default)]
    pub source: MetricsSource,
    /// The Prometheus server, for `source: Prometheus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSpec>,
}

/// A Prometheus server's HTTP API.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusSpec {
    /// Base URL, e.g. `http://prometheus.monitoring:9090`.
    #[schemars(length(min = 1, max = 2048), regex(pattern = "^https?://.+$"))]
    pub url: String,
    /// Window of `max_over_time` so short bursts count, in seconds.
    #[serde(default = "default_prometheus_window")]
    #[schemars(range(min = 1, max = 3600))]
    pub window_seconds: i32,
}

/// The tenants file.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TenantsSpec {
    /// Secret key holding the tenants file (YAML or JSON; see the user guide). Default key `tenants.yaml`.
    pub secret_ref: SecretKeyRef,
}

/// Observed state of a model fleet, recomputed by the operator on every pass.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Runtime pods that exist (the `scale` subresource's status replicas).
    #[serde(default)]
    pub replicas: i32,
    /// Runtime pods that are Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Replica count the operator is driving towards (the autoscaler's decision in `Builtin` mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// Label selector of the runtime pods, as a string (for the `scale` subresource, HPA and KEDA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// `Ready`, `Reconciling`, `Stalled` (kstatus), `DigestVerified`, `ScalingActive`, `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[schemars(length(max = 16))]
    pub conditions: Vec<Condition>,
    /// Metrics behind the last scaling decision (written on decisions, at most every 30 s otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_metrics: Option<ObservedMetrics>,
    /// When the replica count last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// The last few scaling decisions, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub recent_decisions: Vec<ScalingDecision>,
    /// The built-in autoscaler's stabilization state, kept here so it survives an operator restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaler: Option<AutoscalerState>,
    /// The objectives autoscaler's measurements and conclusion (with `spec.autoscaling.objectives` or
    /// `schedule`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objectives: Option<ObjectivesStatus>,
    /// Measured throughput and cost per million output tokens (with `spec.cost`); recomputed at most
    /// every 30 s over `spec.cost.windowSeconds`, rewritten only when a rounded figure changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityStatus>,
    /// The revisions serving and the canary rollout's state and figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// Pods starting now (at most 16): their phase — scheduling, pulling, checking, loading the model —
    /// and, while bytes move, progress, rate and ETA.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub starting: Vec<crate::starting::PodStart>,
    /// The starting pods in one line (the `Starting` column), e.g. `1 Pull 1.2/4.0 GB 45 MB/s ETA 54s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_summary: Option<String>,
}

/// Throughput and cost as measured from the replicas' output-token counters over a window.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CapacityStatus {
    /// Ready replicas measured at the end of the window.
    #[serde(default)]
    pub replicas: i32,
    /// Seconds the figures cover (up to `spec.cost.windowSeconds`; shorter until that much history).
    #[serde(default)]
    pub window_seconds: i64,
    /// Replica-seconds measured in the window (what the observed cost pays for).
    #[serde(default)]
    pub replica_seconds: i64,
    /// Output tokens the replicas produced in the window.
    #[serde(default)]
    pub output_tokens: i64,
    /// Output tokens/s per replica over the window, all of it (3 significant digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_second_per_replica: Option<String>,
    /// Output tokens/s per replica while its queue was non-empty: what a replica does at saturation
    /// (3 significant digits); absent until a replica was seen saturated in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturated_output_tokens_per_second_per_replica: Option<String>,
    /// Replica-seconds spent saturated in the window (what the saturated figure is measured over).
    #[serde(default)]
    pub saturated_replica_seconds: i64,
    /// Observed over saturated throughput, whole percent (0–100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub utilization_percent: Option<i32>,
    /// Cost per million output tokens, observed and at saturation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_million_output_tokens: Option<CostFigures>,
    /// The currency of the costs (`spec.cost.currency`).
    #[serde(default)]
    pub currency: String,
    /// When these figures were computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

/// Cost per million output tokens (decimal strings, 3 significant digits).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CostFigures {
    /// Replica-hours paid over the window ÷ tokens produced in it: what serving actually cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<String>,
    /// The price ÷ saturated throughput: what it would cost with every replica kept busy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_saturation: Option<String>,
}

/// Recommendations that differ from the current replica count, and since when (stabilization windows).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerState {
    /// Recommendations have been above the current count since this candidate's time; its replicas are
    /// the lowest recommendation seen since then (what a scale-up may go to once the up-window passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScalingCandidate>,
    /// Recommendations have been below the current count since this candidate's time; its replicas are
    /// the highest recommendation of the last scale-down window (what a scale-down goes to once no
    /// recommendation of the window is at or above the current count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<ScalingCandidate>,
    /// With `minReplicas: 0`: nothing has been pending, running or arriving since this time (the
    /// scale-to-zero window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<Time>,
}

/// A pending scaling recommendation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScalingCandidate {
    /// When recommendations started to differ from the current count in this direction.
    pub since: Time,
    /// The replica count the window would settle on.
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
}

/// Fleet-wide metrics the autoscaler observed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObservedMetrics {
    /// Requests waiting, summed over ready replicas.
    #[serde(default)]
    pub queue_depth: i64,
    /// Requests running, summed over ready replicas.
    #[serde(default)]
    pub running_requests: i64,
    /// Mean KV-cache utilisation over ready replicas, in whole percent (0–100).
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub kv_cache_utilization_percent: i32,
    /// Replicas whose metrics were read.
    #[serde(default)]
    pub sampled_replicas: i32,
    /// When these figures were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

/// One scaling decision and why.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScalingDecision {
    /// When it was made.
    pub time: Time,
    /// Replicas before.
    pub from: i32,
    /// Replicas after.
    pub to: i32,
    /// Why, in words (e.g. "queue 37 > 3 replicas x target 4").
    #[schemars(length(max = 1024))]
    pub reason: String,
}

fn default_true() -> bool {
    true
}
fn default_min_replicas() -> i32 {
    1
}
fn default_max_replicas() -> i32 {
    4
}
fn default_scale_up_window() -> i32 {
    15
}
fn default_scale_down_window() -> i32 {
    300
}
fn default_scale_to_zero_after() -> i32 {
    300
}
fn default_prometheus_window() -> i32 {
    30
}
fn default_currency() -> String {
    "USD".into()
}
fn default_cost_window() -> i32 {
    600
}
