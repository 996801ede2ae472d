//! Pod volumes as host directories: what each volume should contain, and writing it.
//!
//! emptyDir → an empty directory; hostPath → the host path itself (created for `DirectoryOrCreate`
//! or an empty type); secret, configMap, downwardAPI and projected → files the kubelet owns and
//! rewrites whenever their sources change (Secret rotation reaches running pods);
//! persistentVolumeClaim and other sources are unsupported and reported as such.
//!
//! Invariants: planning is pure (objects, tokens and pod fields in; file sets out); writing a file
//! set replaces each changed file atomically (temp file + rename) and removes files no longer
//! in the set, and writes nothing when the set did not change; a missing non-optional object or key
//! is an error message and the previous contents stay in place.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod, Volume};

use super::dir::PodDir;
use super::fields::{FieldContext, NodeResources, field_value, resource_value};
use super::token::{TokenCache, TokenKey};
use crate::kubelet::objects::{Data, ObjectSource};

/// One file of a managed volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContent {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Unix permission bits.
    pub mode: u32,
}

/// Relative path → content.
pub type Files = BTreeMap<PathBuf, FileContent>;

/// What a volume is on the host.
#[derive(Debug, Clone, PartialEq)]
pub enum VolumePlan {
    /// An empty directory under the pod directory.
    EmptyDir,
    /// A host path used in place; `create` when the kubelet should create it as a directory.
    HostPath {
        /// The host path.
        path: PathBuf,
        /// Whether to create it if missing.
        create: bool,
    },
    /// Files the kubelet writes under the pod directory.
    Files(Files),
}

/// What volumes are planned from.
pub struct PlanInputs<'a> {
    /// Pod fields (downward API).
    pub fields: FieldContext<'a>,
    /// Secrets and ConfigMaps.
    pub objects: &'a dyn ObjectSource,
    /// ServiceAccount tokens already obtained.
    pub tokens: &'a TokenCache,
    /// Node resources (downward API resource fields).
    pub node: &'a NodeResources,
}

const DEFAULT_MODE: i32 = 0o644;

/// The ServiceAccount tokens that the pod's projected volumes need.
pub fn token_keys(pod: &Pod) -> Vec<TokenKey> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes
        .into_iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .map(|t| TokenKey {
            audience: t.audience.clone().filter(|a| !a.is_empty()),
            expiration_seconds: t.expiration_seconds.unwrap_or(3600),
        })
        .collect()
}

/// Plans one volume; `Err` is a message for the pod's status.
pub fn plan(volume: &Volume, inputs: &PlanInputs<'_>) -> Result<VolumePlan, String> {
    let pod = inputs.fields.pod;
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let failed = |msg: String| format!("MountVolume.SetUp failed for volume {:?}: {msg}", volume.name);
    if volume.empty_dir.is_some() {
        return Ok(VolumePlan::EmptyDir);
    }
    if let Some(hp) = &volume.host_path {
        let create = matches!(hp.type_.as_deref(), None | Some("") | Some("DirectoryOrCreate"));
        return Ok(VolumePlan::HostPath {
            path: PathBuf::from(&hp.path),
            create,
        });
    }
    if let Some(s) = &volume.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let mode = s.default_mode.unwrap_or(DEFAULT_MODE);
        let what = format!("secret {name:?}");
        let files = project(
            inputs.objects.secret(ns, &name),
            s.items.as_deref(),
            s.optional,
            mode,
            &what,
        )
        .map_err(failed)?;
        return Ok(VolumePlan::Files(files));
    }
    if let Some(c) = &volume.config_map {
        let mode = c.default_mode.unwrap_or(DEFAULT_MODE);
        let what = format!("configmap {:?}", c.name);
        let files = project(
            inputs.objects.config_map(ns, &c.name),
            c.items.as_deref(),
            c.optional,
            mode,
            &what,
        )
        .map_err(failed)?;
        return Ok(VolumePlan::Files(files));
    }
    if let Some(d) = &volume.downward_api {
        let mode = d.default_mode.unwrap_or(DEFAULT_MODE);
        let files = downward(d.items.as_deref().unwrap_or_default(), mode, inputs).map_err(failed)?;
        return Ok(VolumePlan::Files(files));
    }
    if let Some(p) = &volume.projected {
        let mode = p.default_mode.unwrap_or(DEFAULT_MODE);
        let mut files = Files::new();
        for source in p.sources.iter().flatten() {
            let part = if let Some(s) = &source.secret {
                let what = format!("secret {:?}", s.name);
                project(
                    inputs.objects.secret(ns, &s.name),
                    s.items.as_deref(),
                    s.optional,
                    mode,
                    &what,
                )
            } else if let Some(c) = &source.config_map {
                let what = format!("configmap {:?}", c.name);
                project(
                    inputs.objects.config_map(ns, &c.name),
                    c.items.as_deref(),
                    c.optional,
                    mode,
                    &what,
                )
            } else if let Some(d) = &source.downward_api {
                downward(d.items.as_deref().unwrap_or_default(), mode, inputs)
            } else if let Some(t) = &source.service_account_token {
                let key = TokenKey {
                    audience: t.audience.clone().filter(|a| !a.is_empty()),
                    expiration_seconds: t.expiration_seconds.unwrap_or(3600),
                };
                match inputs.tokens.get(&key) {
                    Some(token) => file(&t.path, token.as_bytes().to_vec(), mode).map(|f| Files::from([f])),
                    None => Err("service account token not yet available".to_string()),
                }
            } else {
                Err("unsupported projected volume source (clusterTrustBundle or podCertificate)".to_string())
            };
            files.extend(part.map_err(failed)?);
        }
        return Ok(VolumePlan::Files(files));
    }
    if volume.persistent_volume_claim.is_some() {
        return Err(failed(
            "persistentVolumeClaim volumes are not supported by the process kubelet".into(),
        ));
    }
    Err(failed(
        "this volume type is not supported by the process kubelet".into(),
    ))
}

/// Files from a Secret or ConfigMap, honouring `items` and `optional`.
fn project(
    data: Option<Data>,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    default_mode: i32,
    what: &str,
) -> Result<Files, String> {
    let optional = optional == Some(true);
    let Some(data) = data else {
        return if optional {
            Ok(Files::new())
        } else {
            Err(format!("{what} not found"))
        };
    };
    let mut files = Files::new();
    match items {
        None => {
            for (key, bytes) in data {
                let (path, content) = file(&key, bytes, default_mode)?;
                files.insert(path, content);
            }
        }
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(bytes) => {
                        let (path, content) =
                            file(&item.path, bytes.clone(), item.mode.unwrap_or(default_mode))?;
                        files.insert(path, content);
                    }
                    None if optional => {}
                    None => return Err(format!("couldn't find key {} in {what}", item.key)),
                }
            }
        }
    }
    Ok(files)
}

/// Downward API files.
fn downward(
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
    inputs: &PlanInputs<'_>,
) -> Result<Files, String> {
    let mut files = Files::new();
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            field_value(&inputs.fields, &f.field_path)?
        } else if let Some(r) = &item.resource_field_ref {
            let container = r.container_name.clone().unwrap_or_default();
            resource_value(inputs.fields.pod, &container, r, inputs.node)?
        } else {
            return Err(format!("downwardAPI item {:?} has no source", item.path));
        };
        let (path, content) = file(&item.path, value.into_bytes(), item.mode.unwrap_or(default_mode))?;
        files.insert(path, content);
    }
    Ok(files)
}

fn file(path: &str, bytes: Vec<u8>, mode: i32) -> Result<(PathBuf, FileContent), String> {
    let rel = PathBuf::from(path);
    let ok = !path.is_empty() && rel.components().all(|c| matches!(c, Component::Normal(_)));
    if !ok {
        return Err(format!("invalid volume file path {path:?}"));
    }
    Ok((
        rel,
        FileContent {
            bytes,
            mode: (mode as u32) & 0o7777,
        },
    ))
}

/// Writes planned volumes and remembers what it wrote, so unchanged volumes cost nothing.
#[derive(Debug, Default)]
pub struct VolumeWriter {
    written: HashMap<String, Files>,
}

impl VolumeWriter {
    /// Makes the host side of `volume` match `plan`. Returns whether anything was written.
    pub fn apply(&mut self, dir: &PodDir, volume: &str, plan: &VolumePlan) -> std::io::Result<bool> {
        match plan {
            VolumePlan::EmptyDir => {
                std::fs::create_dir_all(dir.volume(volume))?;
                Ok(false)
            }
            VolumePlan::HostPath { path, create } => {
                if *create {
                    std::fs::create_dir_all(path)?;
                }
                Ok(false)
            }
            VolumePlan::Files(files) => {
                let root = dir.volume(volume);
                let previous = self.written.get(volume);
                if previous == Some(files) && root.is_dir() {
                    return Ok(false);
                }
                std::fs::create_dir_all(&root)?;
                for (rel, content) in files {
                    if previous.and_then(|p| p.get(rel)) != Some(content) || !root.join(rel).exists() {
                        write_atomic(&root.join(rel), content)?;
                    }
                }
                for rel in previous
                    .into_iter()
                    .flat_map(|p| p.keys())
                    .filter(|r| !files.contains_key(*r))
                {
                    let _ = std::fs::remove_file(root.join(rel));
                }
                self.written.insert(volume.to_string(), files.clone());
                Ok(true)
            }
        }
    }
}

fn write_atomic(path: &Path, content: &FileContent) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!("..{name}.tmp"));
    std::fs::write(&tmp, &content.bytes)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(content.mode))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::objects::FakeObjects;

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c"}], "volumes": volumes}
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
            ("ns".into(), "tenants".into()),
            data(&[("tenants.yaml", "t: 1"), ("other", "o")]),
        );
        o.config_maps.insert(
            ("ns".into(), "kube-root-ca.crt".into()),
            data(&[("ca.crt", "PEM")]),
        );
        o
    }

    fn check(volume: serde_json::Value, expected: Result<VolumePlan, &str>) {
        let pod = pod(serde_json::json!([volume]));
        let objects = objects();
        let mut tokens = TokenCache::default();
        tokens.insert(
            TokenKey {
                audience: None,
                expiration_seconds: 3607,
            },
            "jwt".into(),
            std::time::Duration::from_secs(3607),
        );
        let node = NodeResources {
            cpu: 1.0,
            memory: 1.0,
            ephemeral_storage: 1.0,
        };
        let inputs = PlanInputs {
            fields: FieldContext {
                pod: &pod,
                pod_ip: "127.1.0.1",
                host_ip: "127.0.0.1",
            },
            objects: &objects,
            tokens: &tokens,
            node: &node,
        };
        let volume = &pod.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0];
        match (plan(volume, &inputs), expected) {
            (Err(got), Err(want)) => assert!(got.contains(want), "{got:?} should contain {want:?}"),
            (got, want) => assert_eq!(got, want.map_err(str::to_string)),
        }
    }

    fn files(entries: &[(&str, &str, u32)]) -> VolumePlan {
        VolumePlan::Files(
            entries
                .iter()
                .map(|(p, c, m)| {
                    (
                        PathBuf::from(p),
                        FileContent {
                            bytes: c.as_bytes().to_vec(),
                            mode: *m,
                        },
                    )
                })
                .collect(),
        )
    }

    #[test]
    fn volumes_plan_like_the_kubelet() {
        use serde_json::json;
        check(json!({"name": "v", "emptyDir": {}}), Ok(VolumePlan::EmptyDir));
        check(
            json!({"name": "v", "hostPath": {"path": "/srv/m"}}),
            Ok(VolumePlan::HostPath {
                path: "/srv/m".into(),
                create: true,
            }),
        );
        check(
            json!({"name": "v", "hostPath": {"path": "/srv/m", "type": "Directory"}}),
            Ok(VolumePlan::HostPath {
                path: "/srv/m".into(),
                create: false,
            }),
        );
        check(
            json!({"name": "v", "secret": {"secretName": "tenants"}}),
            Ok(files(&[("other", "o", 0o644), ("tenants.yaml", "t: 1", 0o644)])),
        );
        check(
            json!({"name": "v", "secret": {"secretName": "tenants", "defaultMode": 0o400,
                   "items": [{"key": "tenants.yaml", "path": "dir/t.yaml"}, {"key": "other", "path": "o", "mode": 0o600}]}}),
            Ok(files(&[("dir/t.yaml", "t: 1", 0o400), ("o", "o", 0o600)])),
        );
        check(
            json!({"name": "v", "secret": {"secretName": "nope"}}),
            Err("secret \"nope\" not found"),
        );
        check(
            json!({"name": "v", "secret": {"secretName": "nope", "optional": true}}),
            Ok(files(&[])),
        );
        check(
            json!({"name": "v", "secret": {"secretName": "tenants", "items": [{"key": "k", "path": "k"}]}}),
            Err("couldn't find key k in secret \"tenants\""),
        );
        check(
            json!({"name": "v", "configMap": {"name": "nope"}}),
            Err("configmap \"nope\" not found"),
        );
        check(
            json!({"name": "v", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}),
            Ok(files(&[("labels", "app=\"x\"", 0o644), ("name", "p", 0o644)])),
        );
        check(
            json!({"name": "kube-api-access-x", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}),
            Ok(files(&[
                ("ca.crt", "PEM", 0o644),
                ("namespace", "ns", 0o644),
                ("token", "jwt", 0o644),
            ])),
        );
        check(
            json!({"name": "v", "projected": {"sources": [{"serviceAccountToken": {"audience": "x", "path": "t"}}]}}),
            Err("token not yet available"),
        );
        check(
            json!({"name": "v", "persistentVolumeClaim": {"claimName": "c"}}),
            Err("not supported"),
        );
        check(
            json!({"name": "v", "secret": {"secretName": "tenants", "items": [{"key": "other", "path": "../x"}]}}),
            Err("invalid volume file path"),
        );
    }

    #[test]
    fn writer_writes_only_changes_and_removes_stale_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PodDir::new(tmp.path(), "ns", "p", "u");
        let mut writer = VolumeWriter::default();
        let a = files(&[("a", "1", 0o644), ("sub/b", "2", 0o600)]);
        assert!(writer.apply(&dir, "v", &a).unwrap());
        assert!(!writer.apply(&dir, "v", &a).unwrap());
        let root = dir.volume("v");
        assert_eq!(std::fs::read_to_string(root.join("sub/b")).unwrap(), "2");
        let mode = std::fs::metadata(root.join("sub/b"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let b = files(&[("a", "rotated", 0o644)]);
        assert!(writer.apply(&dir, "v", &b).unwrap());
        assert_eq!(std::fs::read_to_string(root.join("a")).unwrap(), "rotated");
        assert!(!root.join("sub/b").exists());
        assert!(!writer.apply(&dir, "e", &VolumePlan::EmptyDir).unwrap());
        assert!(dir.volume("e").is_dir());
    }
}
