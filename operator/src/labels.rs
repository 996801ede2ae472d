//! Names and labels of the objects the operator owns for a ModelDeployment, in one place so the
//! builders, the selector in status and the pod watches agree.

use std::collections::BTreeMap;

/// `app.kubernetes.io/name` of every runtime pod.
pub const APP_NAME: &str = "modelfleet-runtime";
/// Label naming the ModelDeployment a runtime pod serves.
pub const MODEL_DEPLOYMENT_LABEL: &str = "modelfleet.io/model-deployment";
/// Annotation on runtime pods carrying the digest they were created for.
pub const DIGEST_ANNOTATION: &str = "modelfleet.io/model-digest";
/// Annotation on runtime pods carrying a hash of the whole `spec.model` they were created for (source,
/// digest, delivery, credentials, signature requirement): the fetch verdict of *this* model's pods.
pub const SOURCE_ANNOTATION: &str = "modelfleet.io/model-source";
/// The field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "modelfleet-operator";
/// Name of the runtime's init container (its termination message carries the digest verdict).
pub const FETCH_CONTAINER: &str = "fetch";
/// Name of the runtime container.
pub const RUNTIME_CONTAINER: &str = "runtime";
/// Port of the OpenAI-compatible API.
pub const HTTP_PORT: i32 = 8000;
/// Port of the admin API (adapters).
pub const ADMIN_PORT: i32 = 8001;
/// Port of the runtime's `/metrics` (the admin port: no token there, tenants never reach it).
pub const METRICS_PORT: i32 = ADMIN_PORT;

/// Labels that select the runtime pods of ModelDeployment `name` (immutable once a Deployment exists).
pub fn selector_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), APP_NAME.to_string()),
        ("app.kubernetes.io/instance".to_string(), name.to_string()),
    ])
}

/// All labels of objects owned for ModelDeployment `name`.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let mut l = selector_labels(name);
    l.insert("app.kubernetes.io/managed-by".into(), FIELD_MANAGER.into());
    l.insert("app.kubernetes.io/component".into(), "inference".into());
    l.insert(MODEL_DEPLOYMENT_LABEL.into(), name.into());
    l
}

/// The selector as `k=v,k=v` (for `status.selector`, the scale subresource, HPA and KEDA).
pub fn selector_string(name: &str) -> String {
    selector_labels(name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Name of the runtime Deployment, Service and PodDisruptionBudget.
pub fn workload_name(md: &str) -> String {
    md.to_string()
}

/// Name of the operator-generated admin-token Secret.
pub fn admin_secret_name(md: &str) -> String {
    format!("{md}-admin-token")
}

/// Name of the ConfigMap listing the adapters a runtime pod loads before it reports ready.
pub fn adapters_configmap_name(md: &str) -> String {
    format!("{md}-adapters")
}

/// Finalizer on LoraAdapters: the adapter is unloaded from the pods before the object goes away.
pub const LORA_FINALIZER: &str = "modelfleet.io/lora-unload";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_is_sorted_and_stable() {
        assert_eq!(
            selector_string("smollm2"),
            "app.kubernetes.io/instance=smollm2,app.kubernetes.io/name=modelfleet-runtime"
        );
        assert!(labels("x").contains_key(MODEL_DEPLOYMENT_LABEL));
    }
}
