//! Where runtime pods run and what else they carry: the operator's pod template, then — each merged as
//! a strategic merge patch ([`super::overlay`]) — the chart's `runtime.podDefaults` (its typed fields,
//! then its `podTemplate`), the ModelDeployment's typed pod fields (`nodeSelector`, `tolerations`,
//! `affinity`, …, `volumes`, `volumeMounts` into the runtime container), and its `podTemplate` last.
//!
//! Invariants: after every layer, what the operator owns is exactly as the builder made it — the
//! selector and `modelfleet.io/` labels and annotations, the image, command, args, ports and probes of
//! its containers, its volumes, and its containers' mounts of them or under its directories — or the
//! template is refused naming the layer and the field ([`PodTemplateError`]), never silently
//! corrected. The CRD refuses the same at apply time; this check also covers the chart's defaults and
//! a CRD older than the operator. The merged template must read back as a `PodTemplateSpec`.

use super::overlay::{MergeError, merge_template};
use crate::labels::RUNTIME_CONTAINER;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use modelfleet_crds::placement::{
    OPERATOR_CONTAINERS, OPERATOR_KEY_PREFIX, OPERATOR_LABELS, OPERATOR_PATHS, OPERATOR_VOLUME_PREFIX,
    OPERATOR_VOLUMES, PodSettings,
};
use serde_json::{Map, Value, json};

/// A pod template the layers cannot make: which layer, which field, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTemplateError {
    /// `spec.runtime`, `spec.runtime.podTemplate`, or the chart's `runtime.podDefaults`.
    pub layer: String,
    /// The field, from the pod template's root (`spec.containers[runtime].args`).
    pub field: String,
    /// Why.
    pub message: String,
}

impl std::fmt::Display for PodTemplateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.layer, self.field, self.message)
    }
}

/// The layer names, as a user finds them.
const DEFAULTS: &str = "runtime.podDefaults (the operator's --runtime-pod-defaults)";
const DEFAULTS_TEMPLATE: &str = "runtime.podDefaults.podTemplate (the operator's --runtime-pod-defaults)";
const RUNTIME: &str = "spec.runtime";
const RUNTIME_TEMPLATE: &str = "spec.runtime.podTemplate";

/// `template` with the defaults' and the ModelDeployment's pod settings merged in.
pub fn place(
    template: PodTemplateSpec,
    defaults: &PodSettings,
    own: &PodSettings,
) -> Result<PodTemplateSpec, PodTemplateError> {
    if defaults.is_empty() && own.is_empty() {
        return Ok(template);
    }
    let base = serde_json::to_value(&template).expect("a pod template serialises");
    let mut merged = base.clone();
    let overlay = |s: &PodSettings| s.pod_template.as_ref().map(|t| Value::Object(t.0.clone()));
    let layers = [
        (DEFAULTS, Some(typed_patch(defaults))),
        (DEFAULTS_TEMPLATE, overlay(defaults)),
        (RUNTIME, Some(typed_patch(own))),
        (RUNTIME_TEMPLATE, overlay(own)),
    ];
    for (layer, patch) in layers {
        let Some(patch) = patch else { continue };
        let error = |(field, message): (String, String)| PodTemplateError {
            layer: layer.into(),
            field,
            message,
        };
        declares_owned_volume(&patch).map_err(error)?;
        merge_template(&mut merged, &patch)
            .map_err(|MergeError { field, message }| error((field, message)))?;
        owned_unchanged(&base, &merged).map_err(error)?;
    }
    mounts_have_volumes(&merged).map_err(|(field, message)| PodTemplateError {
        layer: RUNTIME.into(),
        field,
        message,
    })?;
    serde_json::from_value(merged).map_err(|e| PodTemplateError {
        layer: RUNTIME_TEMPLATE.into(),
        field: "(the merged pod template)".into(),
        message: format!("is not a pod template: {e}"),
    })
}

/// Whether the operator's `pod_defaults` make a pod template on their own (checked at start-up, so a
/// bad `--runtime-pod-defaults` stops the operator naming the field instead of stalling every
/// deployment).
pub fn check_defaults(cfg: &crate::config::OperatorConfig) -> Result<(), PodTemplateError> {
    let md: modelfleet_crds::ModelDeployment = serde_json::from_value(json!({
        "apiVersion": "modelfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "defaults-check", "namespace": "default"},
        "spec": {"model": {
            "uri": "file:///model",
            "digest": format!("sha256:{}", "0".repeat(64)),
        }},
    }))
    .expect("a minimal ModelDeployment reads");
    super::deployment::desired_deployment(&md, cfg, 1).map(|_| ())
}

/// The typed fields as a pod-template patch (empty fields leave what is beneath).
pub fn typed_patch(s: &PodSettings) -> Value {
    let mut spec = Map::new();
    let mut put = |key: &str, value: Value, empty: bool| {
        if !empty {
            spec.insert(key.into(), value);
        }
    };
    put("nodeSelector", j(&s.node_selector), s.node_selector.is_empty());
    put("tolerations", j(&s.tolerations), s.tolerations.is_empty());
    put("affinity", j(&s.affinity), s.affinity.is_none());
    put(
        "topologySpreadConstraints",
        j(&s.topology_spread_constraints),
        s.topology_spread_constraints.is_empty(),
    );
    put(
        "priorityClassName",
        j(&s.priority_class_name),
        s.priority_class_name.is_none(),
    );
    put(
        "runtimeClassName",
        j(&s.runtime_class_name),
        s.runtime_class_name.is_none(),
    );
    put(
        "imagePullSecrets",
        j(&s.image_pull_secrets),
        s.image_pull_secrets.is_empty(),
    );
    put(
        "serviceAccountName",
        j(&s.service_account_name),
        s.service_account_name.is_none(),
    );
    put("volumes", j(&s.volumes), s.volumes.is_empty());
    put(
        "containers",
        json!([{"name": RUNTIME_CONTAINER, "volumeMounts": s.volume_mounts}]),
        s.volume_mounts.is_empty(),
    );
    let mut metadata = Map::new();
    if !s.pod_labels.is_empty() {
        metadata.insert("labels".into(), json!(s.pod_labels));
    }
    if !s.pod_annotations.is_empty() {
        metadata.insert("annotations".into(), json!(s.pod_annotations));
    }
    json!({"metadata": metadata, "spec": spec})
}

/// A typed field as JSON (each always serialises).
fn j<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("a pod field serialises")
}

type Refusal = (String, String);

fn refusal(field: String, what: &str) -> Refusal {
    (field, format!("{what} is the operator's and cannot be changed"))
}

/// What the operator owns in `merged` is as in `base`.
fn owned_unchanged(base: &Value, merged: &Value) -> Result<(), Refusal> {
    for which in ["labels", "annotations"] {
        owned_keys(base, merged, which)?;
    }
    for list in ["containers", "initContainers"] {
        owned_containers(base, merged, list)?;
    }
    owned_volumes(base, merged)
}

fn is_owned_key(which: &str, k: &str) -> bool {
    k.starts_with(OPERATOR_KEY_PREFIX) || (which == "labels" && OPERATOR_LABELS.contains(&k))
}

fn owned_keys(base: &Value, merged: &Value, which: &str) -> Result<(), Refusal> {
    let map = |v: &Value| v["metadata"][which].as_object().cloned().unwrap_or_default();
    let (b, m) = (map(base), map(merged));
    let keys = b.keys().chain(m.keys()).filter(|k| is_owned_key(which, k));
    for k in keys {
        if b.get(k) != m.get(k) {
            let what = if which == "labels" {
                "this label (the pods' selector, revision or deployment)"
            } else {
                "this annotation"
            };
            return Err(refusal(format!("metadata.{which}.{k}"), what));
        }
    }
    Ok(())
}

const CONTAINER_OWNED: [&str; 7] = [
    "image",
    "command",
    "args",
    "ports",
    "readinessProbe",
    "livenessProbe",
    "startupProbe",
];

fn named<'a>(v: &'a Value, list: &str, name: &str) -> Option<&'a Value> {
    v["spec"][list].as_array()?.iter().find(|c| c["name"] == name)
}

fn owned_containers(base: &Value, merged: &Value, list: &str) -> Result<(), Refusal> {
    for name in OPERATOR_CONTAINERS {
        let here = format!("spec.{list}[{name}]");
        match (named(base, list, name), named(merged, list, name)) {
            (None, None) => {}
            (None, Some(_)) => return Err(refusal(here, "this container name")),
            (Some(_), None) => return Err(refusal(here, "this container")),
            (Some(b), Some(m)) => {
                for field in CONTAINER_OWNED {
                    if b.get(field) != m.get(field) {
                        return Err(refusal(
                            format!("{here}.{field}"),
                            &format!("the {field} of this container"),
                        ));
                    }
                }
                if owned_mounts(b) != owned_mounts(m) {
                    return Err(refusal(
                        format!("{here}.volumeMounts"),
                        "a mount of the operator's volumes or under /var/lib/modelfleet or /etc/modelfleet",
                    ));
                }
            }
        }
    }
    Ok(())
}

fn is_owned_volume(name: &str) -> bool {
    OPERATOR_VOLUMES.contains(&name) || name.starts_with(OPERATOR_VOLUME_PREFIX)
}

fn is_owned_path(path: &str) -> bool {
    OPERATOR_PATHS
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|rest| rest.starts_with('/')))
}

/// A container's mounts of the operator's volumes or under its directories.
fn owned_mounts(c: &Value) -> Vec<Value> {
    let mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
    mounts
        .into_iter()
        .filter(|m| {
            is_owned_volume(m["name"].as_str().unwrap_or_default())
                || is_owned_path(m["mountPath"].as_str().unwrap_or_default())
        })
        .collect()
}

/// A layer names none of the operator's volumes, not even as the operator has it (as the CRD refuses).
fn declares_owned_volume(patch: &Value) -> Result<(), Refusal> {
    for v in patch["spec"]["volumes"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or_default();
        if is_owned_volume(name) {
            return Err(refusal(format!("spec.volumes[{name}]"), "this volume"));
        }
    }
    Ok(())
}

fn owned_volumes(base: &Value, merged: &Value) -> Result<(), Refusal> {
    let owned = |v: &Value| -> Vec<Value> {
        let list = v["spec"]["volumes"].as_array().cloned().unwrap_or_default();
        list.into_iter()
            .filter(|v| is_owned_volume(v["name"].as_str().unwrap_or_default()))
            .collect()
    };
    let (b, m) = (owned(base), owned(merged));
    for v in b.iter().chain(m.iter()) {
        let name = v["name"].as_str().unwrap_or_default();
        let find = |l: &[Value]| l.iter().find(|x| x["name"] == name).cloned();
        if find(&b) != find(&m) {
            return Err(refusal(format!("spec.volumes[{name}]"), "this volume"));
        }
    }
    Ok(())
}

/// Every mount of the runtime container names a volume of the pod.
fn mounts_have_volumes(merged: &Value) -> Result<(), Refusal> {
    let volumes = merged["spec"]["volumes"].as_array().cloned().unwrap_or_default();
    let Some(runtime) = named(merged, "containers", RUNTIME_CONTAINER) else {
        return Ok(());
    };
    for m in runtime["volumeMounts"].as_array().into_iter().flatten() {
        if !volumes.iter().any(|v| v["name"] == m["name"]) {
            return Err((
                format!(
                    "spec.containers[{RUNTIME_CONTAINER}].volumeMounts[{}]",
                    m["mountPath"]
                ),
                format!(
                    "mounts volume {}, which no layer declares (runtime.volumes, a podTemplate, runtime.podDefaults)",
                    m["name"]
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
