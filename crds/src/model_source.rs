//! `spec.model`: where a model's bytes come from, how they reach the pods, and what they must match —
//! the canonical digest always, a cosign signature when the deployment asks for one.
//!
//! Sources: `file://` (a node path under the operator's node file roots), `http(s)://`, `hf://`,
//! `oci://` (a CNCF ModelPack artifact or a model image, pinned by manifest digest), `s3://` (with
//! `s3` settings), `pvc://` (a claim mounted read-only). Validation rules (CEL) keep each setting
//! with the source it belongs to, so a mistake is refused by the API server naming the field.

use crate::common::{DIGEST_PATTERN, MODEL_URI_PATTERN, OBJECT_NAME_PATTERN, SERVED_NAME_PATTERN};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A model artifact pinned by content digest.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.delivery) || self.delivery == 'Fetch' || self.uri.startsWith('oci://')").message("spec.model.delivery ImageVolume needs an oci:// uri (a model image)").field_path(".delivery"))]
#[x_kube(validation = Rule::new("!has(self.s3) || self.uri.startsWith('s3://')").message("spec.model.s3 goes with an s3:// uri only").field_path(".s3"))]
#[x_kube(validation = Rule::new("!has(self.oci) || self.uri.startsWith('oci://')").message("spec.model.oci goes with an oci:// uri only").field_path(".oci"))]
#[x_kube(validation = Rule::new("!has(self.verify) || self.uri.startsWith('oci://')").message("spec.model.verify (a signature requirement) needs an oci:// uri: signatures are checked for OCI artifacts").field_path(".verify"))]
#[x_kube(validation = Rule::new("!self.uri.startsWith('oci://') || self.uri.matches('^oci://[^/]+/.+@sha256:[0-9a-f]{64}$')").message("an oci:// uri must pin the manifest digest: oci://registry/repository[:tag]@sha256:<64 hex> (a tag alone can move)").field_path(".uri"))]
pub struct ModelSource {
    /// `file:///path`, `http(s)://…`, `hf://org/repo@revision`, `oci://registry/repo[:tag]@sha256:…`,
    /// `s3://bucket/prefix` or `pvc://claim/path`. A Hugging Face model directory, a single `.gguf`
    /// file, or a directory holding exactly one `.gguf` file.
    #[schemars(length(min = 1, max = 2048), regex(pattern = MODEL_URI_PATTERN))]
    pub uri: String,
    /// Canonical content digest the bytes must match: `sha256:<64 hex>` (see the user guide). For
    /// `oci://`, the digest of the model's files — `modelfleet-runtime package` prints it — not the
    /// manifest's (that one is in the uri).
    #[schemars(regex(pattern = DIGEST_PATTERN))]
    pub digest: String,
    /// The name clients put in `model`. Defaults to the ModelDeployment's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = SERVED_NAME_PATTERN))]
    pub served_name: Option<String>,
    /// What the model does: `Generate` (chat and completions) or `Embed` (`/v1/embeddings`). Unset,
    /// the runtime decides from the model's files (an encoder such as BERT embeds; a decoder
    /// generates) and each pod refuses the other endpoints; set, a pod whose model does something else
    /// fails at start-up saying so, and the gateway refuses the other endpoints itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<ModelTask>,
    /// How an `oci://` model reaches the pods: `Fetch` (the default: pulled over the distribution API
    /// into each pod's volume, through the node cache in namespaces that use it; ModelPack artifacts
    /// and model images alike) or `ImageVolume` (a model image mounted by the node's container runtime:
    /// pulled once per node and shared by its pods; needs Kubernetes ≥ 1.33 with containerd ≥ 2.1 or
    /// CRI-O).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// A Secret in the namespace with the source's credentials: `.dockerconfigjson` (a
    /// `kubernetes.io/dockerconfigjson` Secret) for `oci://` — also the image volume's pull secret —;
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`) for `s3://`; `HF_TOKEN`
    /// for `hf://`. Mounted into the fetch container only, never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<ObjectRef>,
    /// `s3://` settings: the endpoint of an S3-compatible store, the region, path-style addressing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Settings>,
    /// `oci://` settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciSettings>,
    /// A signature requirement: no pod of this revision serves until a cosign signature of the
    /// `oci://` manifest verifies with the key (checked offline, before anything is downloaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifySpec>,
}

/// What a model does.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelTask {
    /// Chat and completions (`/v1/chat/completions`, `/v1/completions`).
    Generate,
    /// Embeddings (`/v1/embeddings`).
    Embed,
}

impl ModelTask {
    /// The runtime's `--task` value.
    pub fn flag(self) -> &'static str {
        match self {
            ModelTask::Generate => "generate",
            ModelTask::Embed => "embed",
        }
    }
}

/// How an `oci://` model reaches the pods.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Delivery {
    /// Pulled over the distribution API by the pod's fetch container (through the node cache where
    /// the namespace uses it).
    #[default]
    Fetch,
    /// Mounted as a Kubernetes image volume: the node pulls the model image once and shares it.
    ImageVolume,
}

/// A reference to an object (a Secret) in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// The object's name.
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
}

/// Where an S3-compatible store is and how to address it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct S3Settings {
    /// The endpoint URL of an S3-compatible store (`http(s)://host:port`); AWS's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = "^https?://[^/?#]+/?$"))]
    pub endpoint: Option<String>,
    /// The region (AWS: the bucket's; most S3-compatible stores accept any). Default `us-east-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = "^[a-z0-9-]+$"))]
    pub region: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), which most S3-compatible stores need.
    #[serde(default)]
    pub force_path_style: bool,
}

/// `oci://` settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct OciSettings {
    /// Speak plain HTTP to the registry (one inside the cluster without TLS). Fetch only: for an image
    /// volume, the node's container runtime decides how it reaches a registry.
    #[serde(default, rename = "plainHTTP")]
    pub plain_http: bool,
}

/// What the model's artifact must be signed with.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerifySpec {
    /// A Secret key holding a PEM ECDSA P-256 public key (`cosign.pub`; cosign's default key type):
    /// the manifest needs a cosign signature (the `sha256-<hex>.sig` tag) that verifies with it.
    pub public_key_secret_ref: PublicKeyRef,
}

/// A Secret key holding a public key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublicKeyRef {
    /// Name of the Secret, in the ModelDeployment's namespace.
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
    /// Key inside the Secret.
    #[serde(default = "default_public_key")]
    #[schemars(length(min = 1, max = 253), regex(pattern = "^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

fn default_public_key() -> String {
    "cosign.pub".to_string()
}
