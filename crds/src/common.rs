//! Types and constants shared by both resources: content digests, object references, condition types.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The canonical content digest: `sha256:` followed by 64 lower-case hex digits (see docs/design.md).
pub const DIGEST_PATTERN: &str = "^sha256:[0-9a-f]{64}$";

/// URI schemes an adapter may come from: a local path, HTTP(S), or a Hugging Face repository at a revision.
pub const URI_PATTERN: &str = "^(file|https?|hf)://.+$";

/// URI schemes a model may come from: those of [`URI_PATTERN`], an OCI registry (`oci://`), an S3
/// bucket (`s3://`) or a PersistentVolumeClaim (`pvc://`).
pub const MODEL_URI_PATTERN: &str = "^(file|https?|hf|oci|s3|pvc)://.+$";

/// URI schemes a speculative draft model may come from: every fetched one (not `pvc://`).
pub const DRAFT_URI_PATTERN: &str = "^(file|https?|hf|oci|s3)://.+$";

/// A served model or adapter name as clients put it in `model`: what OpenAI-style clients accept,
/// without whitespace or characters that need escaping in URLs and metric labels.
pub const SERVED_NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$";

/// A DNS-1123 subdomain (the names of Kubernetes objects).
pub const OBJECT_NAME_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// Condition types, kept as constants so the operator, tests and docs agree on spelling.
pub mod condition_types {
    /// kstatus: the resource is fully reconciled and serving.
    pub const READY: &str = "Ready";
    /// kstatus: the controller is working towards the desired state.
    pub const RECONCILING: &str = "Reconciling";
    /// kstatus: progress has stopped and needs a user's action.
    pub const STALLED: &str = "Stalled";
    /// The artifact's bytes matched its declared digest.
    pub const DIGEST_VERIFIED: &str = "DigestVerified";
    /// The built-in autoscaler has fresh metrics and is acting on them.
    pub const SCALING_ACTIVE: &str = "ScalingActive";
    /// Serving, but below the desired capacity or with failing replicas.
    pub const DEGRADED: &str = "Degraded";
    /// ModelDeployment: runtime containers restarted recently; the message quotes the latest
    /// termination's reason (from the runtime's termination log).
    pub const RUNTIME_RESTARTS: &str = "RuntimeRestarts";
    /// ModelDeployment: `runtime.resources` reserves GPUs (`*/gpu`), which this release's CPU engine
    /// does not use.
    pub const GPU_UNUSED: &str = "GPUUnused";
    /// ModelDeployment: another deployment behind the same gateway claims one of its served names.
    pub const SERVED_NAME_CONFLICT: &str = "ServedNameConflict";
    /// ModelDeployment: `False` with the scheduler's message while a runtime pod cannot be placed.
    pub const SCHEDULABLE: &str = "Schedulable";
    /// LoraAdapter: the adapter's bytes matched its digest and it fits the base model.
    pub const VERIFIED: &str = "Verified";
    /// ModelDeployment with a canary rollout: `True` while stable or progressing, `False` with reason
    /// `RolledBack` or `Aborted` after the canary was withdrawn.
    pub const PROGRESSING: &str = "Progressing";
}

/// A reference to a Secret key in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret, in the namespace of the referring object.
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
    /// Key inside the Secret.
    #[serde(default = "default_tenants_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_tenants_key() -> String {
    "tenants.yaml".to_string()
}
