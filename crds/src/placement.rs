//! Where runtime pods run and what else they carry (`spec.runtime`'s pod fields): typed fields for the
//! frequent cases — `nodeSelector`, `tolerations`, `affinity`, `topologySpreadConstraints`,
//! `priorityClassName`, `runtimeClassName`, `imagePullSecrets`, `serviceAccountName`, `podLabels`,
//! `podAnnotations`, `volumes` + `volumeMounts` — and `podTemplate`, a strategic-merge overlay of the
//! pod template for the rest.
//!
//! Invariants the schema holds (CEL, so the API server refuses a violation at apply time, naming the
//! field): what makes a pod the operator's stays the operator's — the selector and revision labels
//! (`app.kubernetes.io/name`, `app.kubernetes.io/instance`, every `modelfleet.io/` label and
//! annotation), the image, command, args, ports and probes of the containers it runs
//! ([`OPERATOR_CONTAINERS`]), and its volumes ([`OPERATOR_VOLUMES`], the model volume first) and
//! their paths (`/var/lib/modelfleet`, `/etc/modelfleet`). The operator checks the same after merging
//! (the chart's defaults are no CRD), so nothing bypasses it. Lists and maps are bounded, which keeps
//! the rules' cost estimate within the API server's budget. A message naming the offending entry maps
//! the list to names before filtering it: the API server's estimator puts `self.filter(…)[0].name`
//! beyond its budget (over 100×) even with every list and string bounded, `self.map(…).filter(…)[0]`
//! well within it.

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, Toleration, TopologySpreadConstraint, Volume, VolumeMount,
};
use kube::KubeSchema;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Containers the operator runs in every runtime pod (the runtime, the model's fetch, a draft model's
/// fetch): their image, command, args, ports and probes are the operator's.
pub const OPERATOR_CONTAINERS: [&str; 3] = ["runtime", "fetch", "fetch-draft"];

/// Volumes the operator may put in a runtime pod (the model's first); `node-files-<n>` too
/// ([`OPERATOR_VOLUME_PREFIX`]).
pub const OPERATOR_VOLUMES: [&str; 10] = [
    "model",
    "admin-token",
    "adapters",
    "adapter-store",
    "tmp",
    "model-cache",
    "draft-model",
    "model-credentials",
    "model-key",
    "tenants",
];

/// Prefix of the node file roots' volumes (`node-files-0`, …).
pub const OPERATOR_VOLUME_PREFIX: &str = "node-files-";

/// Label keys that select a deployment's pods; with every `modelfleet.io/` key, the operator's.
pub const OPERATOR_LABELS: [&str; 2] = ["app.kubernetes.io/name", "app.kubernetes.io/instance"];

/// The prefix of label and annotation keys the operator owns (model-deployment, revision, track,
/// model digest and source).
pub const OPERATOR_KEY_PREFIX: &str = "modelfleet.io/";

/// Directories of the pod the operator mounts under.
pub const OPERATOR_PATHS: [&str; 2] = ["/var/lib/modelfleet", "/etc/modelfleet"];

/// CEL: a label key that is not the operator's (`k`).
const LABEL_KEY_FREE: &str =
    "!(k in ['app.kubernetes.io/name', 'app.kubernetes.io/instance']) && !k.startsWith('modelfleet.io/')";
/// CEL: a volume name that is not the operator's (`v`).
const VOLUME_FREE: &str = "!(v.name in ['model', 'admin-token', 'adapters', 'adapter-store', 'tmp', \
     'model-cache', 'draft-model', 'model-credentials', 'model-key', 'tenants']) && \
     !v.name.startsWith('node-files-')";
/// CEL: a mount path outside the operator's directories (`m`).
const PATH_FREE: &str = "!(m.mountPath == '/var/lib/modelfleet' || m.mountPath.startsWith('/var/lib/modelfleet/') \
     || m.mountPath == '/etc/modelfleet' || m.mountPath.startsWith('/etc/modelfleet/'))";

/// The JSON names of [`PodSettings`]' fields (what `--runtime-pod-defaults` may hold).
pub const POD_SETTINGS_FIELDS: [&str; 13] = [
    "nodeSelector",
    "tolerations",
    "affinity",
    "topologySpreadConstraints",
    "priorityClassName",
    "runtimeClassName",
    "imagePullSecrets",
    "serviceAccountName",
    "podLabels",
    "podAnnotations",
    "volumes",
    "volumeMounts",
    "podTemplate",
];

/// The pod fields of `spec.runtime` (flattened into it) — also the shape of the chart's
/// `runtime.podDefaults`, which the operator applies beneath every ModelDeployment's.
///
/// Every field merges into the operator's pod template as a strategic merge patch would: maps key by
/// key, `volumes` and `imagePullSecrets` by name, `volumeMounts` by path, `topologySpreadConstraints`
/// by topology key; `tolerations`, scalars and everything else replace what is beneath.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodSettings {
    /// Node labels a pod's node must have (e.g. `node.kubernetes.io/instance-type`, a pool label).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate (a dedicated node pool's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tolerations: Vec<Toleration>,
    /// Node affinity, and pod affinity or anti-affinity (e.g. one replica per node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// How replicas spread over zones or nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// The pods' PriorityClass: a higher one preempts batch work when the pool is full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
    /// The pods' RuntimeClass (e.g. `nvidia`, or a sandboxed runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub runtime_class_name: Option<String>,
    /// More Secrets to pull images with, beside the operator's (`imagePullSecrets` of the chart).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// The pods' ServiceAccount (e.g. one annotated for IRSA or workload identity). Its token is not
    /// mounted unless `podTemplate` sets `automountServiceAccountToken: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,
    /// Labels on every runtime pod (not the selector's, nor `modelfleet.io/` ones).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    #[x_kube(validation = Rule::new(format!("self.all(k, {LABEL_KEY_FREE})")).message(Message::Expression(format!("'runtime.podLabels: ' + self.filter(k, !({LABEL_KEY_FREE}))[0] + ' is the operator\\'s (the pods\\' selector and revision labels)'"))))]
    pub pod_labels: BTreeMap<String, String>,
    /// Annotations on every runtime pod (not `modelfleet.io/` ones).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    #[x_kube(validation = Rule::new("self.all(k, !k.startsWith('modelfleet.io/'))").message(Message::Expression("'runtime.podAnnotations: ' + self.filter(k, k.startsWith('modelfleet.io/'))[0] + ' is the operator\\'s'".into())))]
    pub pod_annotations: BTreeMap<String, String>,
    /// More volumes of the pod (a CA bundle, a shared cache); mount them with `volumeMounts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(format!("self.all(v, {VOLUME_FREE})")).message(Message::Expression(format!("'runtime.volumes: ' + self.map(v, v.name).filter(v, !({NAME_FREE}))[0] + ' is the name of a volume the operator mounts'", NAME_FREE = VOLUME_FREE.replace("v.name", "v")))))]
    pub volumes: Vec<Volume>,
    /// Where the runtime container mounts them (outside `/var/lib/modelfleet` and `/etc/modelfleet`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(format!("self.all(m, {PATH_FREE})")).message(Message::Expression(format!("'runtime.volumeMounts: ' + self.map(m, m.mountPath).filter(m, !({MOUNT_FREE}))[0] + ' is under a directory the operator mounts (/var/lib/modelfleet, /etc/modelfleet)'", MOUNT_FREE = PATH_FREE.replace("m.mountPath", "m")))))]
    pub volume_mounts: Vec<VolumeMount>,
    /// The rest of the pod template, merged last as a strategic merge patch: `metadata.labels` and
    /// `annotations`, and any `spec` field — containers (a sidecar, or the runtime container's `env`,
    /// `resources`, `securityContext`, `lifecycle` by `name: runtime`), init containers, volumes, DNS,
    /// host aliases, scheduling gates. The operator's fields are refused (see the user guide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplateOverlay>,
}

impl PodSettings {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == PodSettings::default()
    }
}

/// A pod template overlay (`metadata` + `spec`, as in a Deployment's template), kept as JSON: the
/// schema declares what the protection rules read and preserves every other field for the strategic
/// merge (the API server validates the merged pod when the operator applies its Deployment).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(transparent)]
pub struct PodTemplateOverlay(pub serde_json::Map<String, serde_json::Value>);

impl JsonSchema for PodTemplateOverlay {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PodTemplateOverlay".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let string_map = |max: u32, rule: serde_json::Value| {
            json_schema!({
                "type": "object",
                "additionalProperties": {"type": "string"},
                "maxProperties": max,
                "x-kubernetes-validations": [rule],
            })
        };
        let labels = string_map(
            64,
            serde_json::json!({
                "rule": format!("self.all(k, {LABEL_KEY_FREE})"),
                "messageExpression": format!("'podTemplate.metadata.labels: ' + self.filter(k, !({LABEL_KEY_FREE}))[0] + ' is the operator\\'s (the pods\\' selector and revision labels)'"),
            }),
        );
        let annotations = string_map(
            64,
            serde_json::json!({
                "rule": "self.all(k, !k.startsWith('modelfleet.io/'))",
                "messageExpression": "'podTemplate.metadata.annotations: ' + self.filter(k, k.startsWith('modelfleet.io/'))[0] + ' is the operator\\'s'",
            }),
        );
        json_schema!({
            "description": "A pod template overlay: metadata.labels/annotations and any PodSpec field, merged \
                            into the operator's template as a strategic merge patch (containers, volumes, env by \
                            name; volumeMounts by mountPath). The operator's labels, containers' image, command, \
                            args, ports and probes, and volumes are refused.",
            "type": "object",
            "properties": {
                "metadata": {
                    "type": "object",
                    "properties": {"labels": labels, "annotations": annotations},
                },
                "spec": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {
                        "containers": container_list(),
                        "initContainers": container_list(),
                        "volumes": {
                            "type": "array",
                            "maxItems": 32,
                            "items": {
                                "type": "object",
                                "required": ["name"],
                                "x-kubernetes-preserve-unknown-fields": true,
                                "properties": {"name": {"type": "string", "maxLength": 63}},
                            },
                            "x-kubernetes-validations": [{
                                "rule": format!("self.all(v, {VOLUME_FREE})"),
                                "messageExpression": format!("'podTemplate.spec.volumes: ' + self.map(v, v.name).filter(v, !({NAME_FREE}))[0] + ' is the name of a volume the operator mounts'", NAME_FREE = VOLUME_FREE.replace("v.name", "v")),
                            }],
                        },
                    },
                },
            },
        })
    }
}

/// The schema of `containers` and `initContainers` in the overlay: each names a container; those the
/// operator runs may not set the fields it owns.
fn container_list() -> serde_json::Value {
    let object = || serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let owned = "has(self.image) || has(self.command) || has(self.args) || has(self.ports) || \
                 has(self.readinessProbe) || has(self.livenessProbe) || has(self.startupProbe)";
    let which = "has(self.image) ? 'image' : has(self.command) ? 'command' : has(self.args) ? 'args' : \
                 has(self.ports) ? 'ports' : has(self.readinessProbe) ? 'readinessProbe' : \
                 has(self.livenessProbe) ? 'livenessProbe' : 'startupProbe'";
    serde_json::json!({
        "type": "array",
        "maxItems": 16,
        "items": {
            "type": "object",
            "required": ["name"],
            "x-kubernetes-preserve-unknown-fields": true,
            "properties": {
                "name": {"type": "string", "maxLength": 63},
                "image": {"type": "string"},
                "command": {"type": "array", "items": {"type": "string"}},
                "args": {"type": "array", "items": {"type": "string"}},
                "ports": {"type": "array", "items": object()},
                "readinessProbe": object(),
                "livenessProbe": object(),
                "startupProbe": object(),
            },
            "x-kubernetes-validations": [{
                "rule": format!("!(self.name in ['runtime', 'fetch', 'fetch-draft']) || !({owned})"),
                "messageExpression": format!("'podTemplate: container ' + self.name + ': ' + ({which}) + ' is the operator\\'s (use runtime.image, runtime.extraArgs, runtime.env)'"),
            }],
        },
    })
}
