//! Downward API values: `fieldRef` and `resourceFieldRef`, shared by env vars and volumes.
//!
//! Invariants: only the field paths Kubernetes allows are answered (anything else is an error
//! message, never a panic); label and annotation maps are rendered like the kubelet
//! (`key="value"` lines sorted by key); resources not set on the container fall back to the node's
//! allocatable amount for limits and to 0 for requests.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ResourceFieldSelector};

use crate::kubelet::quantity;

/// What field paths resolve against.
#[derive(Debug, Clone, Copy)]
pub struct FieldContext<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The pod's IP (empty before one is assigned).
    pub pod_ip: &'a str,
    /// The node's IP.
    pub host_ip: &'a str,
}

/// The node's allocatable resources, used when a container sets no limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeResources {
    /// CPU cores.
    pub cpu: f64,
    /// Memory bytes.
    pub memory: f64,
    /// Ephemeral storage bytes.
    pub ephemeral_storage: f64,
}

/// The value of a `fieldRef` field path.
pub fn field_value(ctx: &FieldContext<'_>, path: &str) -> Result<String, String> {
    let meta = &ctx.pod.metadata;
    let spec = ctx.pod.spec.as_ref();
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['").or_else(|| rest.strip_prefix("[\"")))
            .and_then(|rest| rest.strip_suffix("']").or_else(|| rest.strip_suffix("\"]")))
            .map(str::to_string)
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(labels),
        "metadata.annotations" => format_map(annotations),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => ctx.pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.to_string(),
        _ => {
            if let Some(key) = subscript("metadata.labels") {
                labels.get(&key).cloned().unwrap_or_default()
            } else if let Some(key) = subscript("metadata.annotations") {
                annotations.get(&key).cloned().unwrap_or_default()
            } else {
                return Err(format!("unsupported fieldRef fieldPath {path:?}"));
            }
        }
    };
    Ok(value)
}

/// `key="value"` lines, sorted by key, as the kubelet writes labels and annotations.
pub fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of a `resourceFieldRef` for container `container` of `pod`.
pub fn resource_value(
    pod: &Pod,
    container: &str,
    selector: &ResourceFieldSelector,
    node: &NodeResources,
) -> Result<String, String> {
    let spec = pod.spec.as_ref().ok_or("pod has no spec")?;
    let c = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == container)
        .ok_or_else(|| format!("resourceFieldRef: no container {container:?}"))?;
    let (kind, resource) = selector
        .resource
        .split_once('.')
        .ok_or_else(|| format!("unsupported resourceFieldRef resource {:?}", selector.resource))?;
    let resources = c.resources.as_ref();
    let set = match kind {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => {
            return Err(format!(
                "unsupported resourceFieldRef resource {:?}",
                selector.resource
            ));
        }
    };
    let fallback = match (kind, resource) {
        (_, r) if !matches!(r, "cpu" | "memory" | "ephemeral-storage") => {
            return Err(format!(
                "unsupported resourceFieldRef resource {:?}",
                selector.resource
            ));
        }
        ("requests", _) => 0.0,
        (_, "cpu") => node.cpu,
        (_, "memory") => node.memory,
        _ => node.ephemeral_storage,
    };
    let value = match set.and_then(|m| m.get(resource)) {
        Some(q) => quantity::parse(&q.0)?,
        None => fallback,
    };
    let divisor = match &selector.divisor {
        Some(d) => quantity::parse(&d.0)?,
        None => 1.0,
    };
    Ok(quantity::divide_ceil(value, divisor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                         "labels": {"b": "2", "a": "1"}, "annotations": {"note": "say \"hi\""}},
            "spec": {"nodeName": "mf-node-0", "serviceAccountName": "sa", "containers": [
                {"name": "c", "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}},
                {"name": "bare"}
            ]}
        }))
        .unwrap()
    }

    fn check_field(path: &str, expected: Result<&str, ()>) {
        let pod = pod();
        let ctx = FieldContext {
            pod: &pod,
            pod_ip: "127.1.0.7",
            host_ip: "127.0.0.1",
        };
        assert_eq!(
            field_value(&ctx, path).map_err(|_| ()),
            expected.map(str::to_string),
            "{path}"
        );
    }

    #[test]
    fn field_paths() {
        check_field("metadata.name", Ok("p"));
        check_field("metadata.namespace", Ok("ns"));
        check_field("metadata.uid", Ok("u-1"));
        check_field("metadata.labels", Ok("a=\"1\"\nb=\"2\""));
        check_field("metadata.labels['b']", Ok("2"));
        check_field("metadata.labels['missing']", Ok(""));
        check_field("metadata.annotations['note']", Ok("say \"hi\""));
        check_field("metadata.annotations", Ok("note=\"say \\\"hi\\\"\""));
        check_field("spec.nodeName", Ok("mf-node-0"));
        check_field("spec.serviceAccountName", Ok("sa"));
        check_field("status.podIP", Ok("127.1.0.7"));
        check_field("status.podIPs", Ok("127.1.0.7"));
        check_field("status.hostIP", Ok("127.0.0.1"));
        check_field("spec.containers", Err(()));
    }

    fn check_resource(container: &str, resource: &str, divisor: Option<&str>, expected: Result<&str, ()>) {
        let node = NodeResources {
            cpu: 2.0,
            memory: 4096.0,
            ephemeral_storage: 1e9,
        };
        let selector = ResourceFieldSelector {
            container_name: None,
            divisor: divisor.map(|d| Quantity(d.to_string())),
            resource: resource.to_string(),
        };
        let got = resource_value(&pod(), container, &selector, &node).map_err(|_| ());
        assert_eq!(
            got,
            expected.map(str::to_string),
            "{container} {resource} {divisor:?}"
        );
    }

    #[test]
    fn resource_fields() {
        check_resource("c", "limits.cpu", None, Ok("1"));
        check_resource("c", "limits.cpu", Some("1m"), Ok("500"));
        check_resource("c", "limits.memory", Some("1Mi"), Ok("1024"));
        check_resource("bare", "limits.cpu", None, Ok("2"));
        check_resource("bare", "limits.memory", None, Ok("4096"));
        check_resource("bare", "requests.cpu", None, Ok("0"));
        check_resource("c", "requests.memory", None, Ok("0"));
        check_resource("c", "limits.gpu", None, Err(()));
        check_resource("nope", "limits.cpu", None, Err(()));
        check_resource("c", "cpu", None, Err(()));
    }
}
