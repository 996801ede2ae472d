//! A container's environment, built the way the kubelet builds it.
//!
//! Order: the harness's base variables (`PATH`, `HOSTNAME`, `KUBECONFIG`, `KUBERNETES_SERVICE_*`),
//! then `envFrom` sources, then `env` entries; a later definition replaces an earlier one. Literal
//! `env` values are path-rewritten and then `$(VAR)`-expanded against everything defined before
//! them; values from Secrets, ConfigMaps and the downward API are data and are used verbatim.
//! `HOME` is the pod directory unless the container defines it.
//!
//! Invariants: a missing non-optional Secret/ConfigMap or key is an error message (the container
//! then waits with `CreateContainerConfigError`); `envFrom` keys that are not valid variable names
//! are skipped, as the kubelet does.

use k8s_openapi::api::core::v1::Container;

use super::fields::{FieldContext, NodeResources, field_value, resource_value};
use crate::kubelet::expand::expand;
use crate::kubelet::objects::ObjectSource;
use crate::kubelet::rewrite::PathRewriter;

/// One variable before expansion.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvEntry {
    /// Variable name.
    pub name: String,
    /// Raw value.
    pub value: String,
    /// Whether the value is a literal of the pod spec (rewritten and expanded) rather than data.
    pub literal: bool,
}

/// What a container's environment is computed from.
pub struct EnvInputs<'a> {
    /// Pod fields for `fieldRef`.
    pub fields: FieldContext<'a>,
    /// The container.
    pub container: &'a Container,
    /// Secrets and ConfigMaps.
    pub objects: &'a dyn ObjectSource,
    /// Node resources for `resourceFieldRef` without limits.
    pub node: &'a NodeResources,
    /// Base variables set before anything of the pod spec.
    pub base: Vec<(String, String)>,
}

/// Resolves every source into raw entries, in definition order.
pub fn collect(inputs: &EnvInputs<'_>) -> Result<Vec<EnvEntry>, String> {
    let namespace = inputs
        .fields
        .pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default();
    let mut entries: Vec<EnvEntry> = inputs
        .base
        .iter()
        .map(|(name, value)| EnvEntry {
            name: name.clone(),
            value: value.clone(),
            literal: false,
        })
        .collect();
    for from in inputs.container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let data = if let Some(s) = &from.secret_ref {
            match inputs.objects.secret(namespace, &s.name) {
                Some(d) => d,
                None if s.optional == Some(true) => continue,
                None => return Err(format!("secret {:?} not found", s.name)),
            }
        } else if let Some(c) = &from.config_map_ref {
            match inputs.objects.config_map(namespace, &c.name) {
                Some(d) => d,
                None if c.optional == Some(true) => continue,
                None => return Err(format!("configmap {:?} not found", c.name)),
            }
        } else {
            continue;
        };
        for (key, value) in data {
            let name = format!("{prefix}{key}");
            if is_env_name(&name) {
                entries.push(EnvEntry {
                    name,
                    value: String::from_utf8_lossy(&value).into_owned(),
                    literal: false,
                });
            }
        }
    }
    for var in inputs.container.env.iter().flatten() {
        let entry = match &var.value_from {
            None => EnvEntry {
                name: var.name.clone(),
                value: var.value.clone().unwrap_or_default(),
                literal: true,
            },
            Some(source) => {
                let value = if let Some(f) = &source.field_ref {
                    field_value(&inputs.fields, &f.field_path)?
                } else if let Some(r) = &source.resource_field_ref {
                    let container = r.container_name.as_deref().filter(|c| !c.is_empty());
                    let container = container.unwrap_or(&inputs.container.name);
                    resource_value(inputs.fields.pod, container, r, inputs.node)?
                } else if let Some(s) = &source.secret_key_ref {
                    let optional = s.optional == Some(true);
                    match lookup_key(inputs.objects.secret(namespace, &s.name), &s.key, optional) {
                        Lookup::Found(v) => v,
                        Lookup::Skip => continue,
                        Lookup::NoObject => return Err(format!("secret {:?} not found", s.name)),
                        Lookup::NoKey => {
                            return Err(format!(
                                "couldn't find key {} in Secret {namespace}/{}",
                                s.key, s.name
                            ));
                        }
                    }
                } else if let Some(c) = &source.config_map_key_ref {
                    let optional = c.optional == Some(true);
                    match lookup_key(inputs.objects.config_map(namespace, &c.name), &c.key, optional) {
                        Lookup::Found(v) => v,
                        Lookup::Skip => continue,
                        Lookup::NoObject => return Err(format!("configmap {:?} not found", c.name)),
                        Lookup::NoKey => {
                            return Err(format!(
                                "couldn't find key {} in ConfigMap {namespace}/{}",
                                c.key, c.name
                            ));
                        }
                    }
                } else {
                    return Err(format!("env {:?}: unsupported valueFrom source", var.name));
                };
                EnvEntry {
                    name: var.name.clone(),
                    value,
                    literal: false,
                }
            }
        };
        entries.push(entry);
    }
    Ok(entries)
}

enum Lookup {
    Found(String),
    Skip,
    NoObject,
    NoKey,
}

fn lookup_key(data: Option<crate::kubelet::objects::Data>, key: &str, optional: bool) -> Lookup {
    match data.map(|d| d.get(key).map(|v| String::from_utf8_lossy(v).into_owned())) {
        Some(Some(v)) => Lookup::Found(v),
        _ if optional => Lookup::Skip,
        None => Lookup::NoObject,
        Some(None) => Lookup::NoKey,
    }
}

/// Rewrites and expands literals in order; later definitions replace earlier ones in place.
/// `home` is added as `HOME` unless defined.
pub fn finalize(entries: &[EnvEntry], rewriter: &PathRewriter, home: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::with_capacity(entries.len() + 1);
    for entry in entries {
        let value = if entry.literal {
            let rewritten = rewriter.rewrite(&entry.value);
            expand(&rewritten, |name| lookup(&env, name))
        } else {
            entry.value.clone()
        };
        match env.iter_mut().find(|(n, _)| *n == entry.name) {
            Some(slot) => slot.1 = value,
            None => env.push((entry.name.clone(), value)),
        }
    }
    if lookup(&env, "HOME").is_none() {
        env.push(("HOME".to_string(), home.to_string()));
    }
    env
}

/// The value of `name` in an environment list.
pub fn lookup(env: &[(String, String)], name: &str) -> Option<String> {
    env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
}

/// Whether `name` is usable as an environment variable name (C identifier rules plus `.` and `-`,
/// which Kubernetes accepts).
fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::objects::FakeObjects;
    use k8s_openapi::api::core::v1::Pod;
    use std::path::PathBuf;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c"}]}
        }))
        .unwrap()
    }

    fn objects() -> FakeObjects {
        let mut o = FakeObjects::default();
        let data = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect()
        };
        o.secrets.insert(
            ("ns".into(), "creds".into()),
            data(&[("token", "s3cr3t"), ("bad key", "x")]),
        );
        o.config_maps.insert(
            ("ns".into(), "cfg".into()),
            data(&[("MODE", "fast"), ("1st", "no")]),
        );
        o
    }

    fn check(container: serde_json::Value, expected: Result<&[(&str, &str)], &str>) {
        let pod = pod();
        let container: Container = serde_json::from_value(container).unwrap();
        let objects = objects();
        let node = NodeResources {
            cpu: 2.0,
            memory: 1024.0,
            ephemeral_storage: 1.0,
        };
        let inputs = EnvInputs {
            fields: FieldContext {
                pod: &pod,
                pod_ip: "127.1.0.2",
                host_ip: "127.0.0.1",
            },
            container: &container,
            objects: &objects,
            node: &node,
            base: vec![
                ("PATH".into(), "/usr/bin".into()),
                ("HOSTNAME".into(), "p".into()),
            ],
        };
        let rewriter = PathRewriter::new([("/models".to_string(), PathBuf::from("/pod/volumes/m"))]);
        let got = collect(&inputs).map(|entries| finalize(&entries, &rewriter, "/pod"));
        match expected {
            Ok(pairs) => {
                let pairs: Vec<(String, String)> = pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                assert_eq!(got, Ok(pairs));
            }
            Err(msg) => {
                let err = got.expect_err("expected an error");
                assert!(err.contains(msg), "{err:?} should contain {msg:?}");
            }
        }
    }

    #[test]
    fn env_is_built_in_kubelet_order() {
        check(
            serde_json::json!({"name": "c", "env": [
                {"name": "DIR", "value": "/models/llama"},
                {"name": "ARG", "value": "--dir=$(DIR) $(HOSTNAME) $(NOPE) $$(DIR)"},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "DATA", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "MODE"}}},
                {"name": "PATH", "value": "/opt:$(PATH)"},
            ]}),
            Ok(&[
                ("PATH", "/opt:/usr/bin"),
                ("HOSTNAME", "p"),
                ("DIR", "/pod/volumes/m/llama"),
                ("ARG", "--dir=/pod/volumes/m/llama p $(NOPE) $(DIR)"),
                ("POD_IP", "127.1.0.2"),
                ("APP", "x"),
                ("TOKEN", "s3cr3t"),
                ("CPU", "2"),
                ("DATA", "fast"),
                ("HOME", "/pod"),
            ]),
        );
    }

    #[test]
    fn env_from_prefixes_and_skips_invalid_names() {
        check(
            serde_json::json!({"name": "c", "envFrom": [
                {"configMapRef": {"name": "cfg"}, "prefix": "CM_"},
                {"configMapRef": {"name": "cfg"}},
                {"secretRef": {"name": "missing", "optional": true}},
            ], "env": [{"name": "HOME", "value": "/home/x"}, {"name": "MODE", "value": "slow"}]}),
            Ok(&[
                ("PATH", "/usr/bin"),
                ("HOSTNAME", "p"),
                ("CM_1st", "no"),
                ("CM_MODE", "fast"),
                ("MODE", "slow"),
                ("HOME", "/home/x"),
            ]),
        );
    }

    #[test]
    fn missing_sources_are_config_errors_unless_optional() {
        let env = |v: serde_json::Value| serde_json::json!({"name": "c", "env": [v]});
        check(
            env(
                serde_json::json!({"name": "T", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}),
            ),
            Err("secret \"nope\" not found"),
        );
        check(
            env(
                serde_json::json!({"name": "T", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}}),
            ),
            Err("couldn't find key k in Secret ns/creds"),
        );
        check(
            env(
                serde_json::json!({"name": "T", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k", "optional": true}}}),
            ),
            Ok(&[("PATH", "/usr/bin"), ("HOSTNAME", "p"), ("HOME", "/pod")]),
        );
        check(
            env(
                serde_json::json!({"name": "T", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}}),
            ),
            Err("configmap \"nope\" not found"),
        );
        check(
            serde_json::json!({"name": "c", "envFrom": [{"secretRef": {"name": "nope"}}]}),
            Err("secret \"nope\" not found"),
        );
        check(
            env(serde_json::json!({"name": "T", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}})),
            Err("unsupported fieldRef"),
        );
    }
}
