//! Turning a container spec into a process to start: image → program, env, path rewriting,
//! `$(VAR)` expansion and working directory.
//!
//! Order, as in the kubelet plus the harness's rewriting: resolve the image; resolve env sources;
//! build the mount rewriter (subPathExpr expanded with the raw env); finalise env (literals
//! rewritten, then expanded); rewrite, then expand command and args; resolve the executable.
//! Rewriting before expansion means a value is never rewritten twice.
//!
//! Invariant: failures are classified for the status: [`LaunchError::Image`] (ErrImagePull),
//! [`LaunchError::Config`] (CreateContainerConfigError), [`LaunchError::Start`] (a start error,
//! reported like a runtime's: terminated with exit code 128).

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Container;

use super::dir::PodDir;
use super::env::{self, EnvEntry, EnvInputs};
use super::fields::{FieldContext, NodeResources};
use super::process::LaunchSpec;
use crate::kubelet::apiserver::ApiAccess;
use crate::kubelet::expand::expand;
use crate::kubelet::images::{self, ImageEntry, ImageMap};
use crate::kubelet::objects::ObjectSource;
use crate::kubelet::rewrite::{PathRewriter, join_sub_path};

/// Default `terminationMessagePath`.
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// Why a container cannot start.
#[derive(Debug, Clone, PartialEq)]
pub enum LaunchError {
    /// The image is not in the image map.
    Image(String),
    /// The spec refers to something missing or invalid.
    Config(String),
    /// The process cannot be started (executable or working directory missing).
    Start(String),
}

/// What a container launch is built from.
pub struct LaunchInputs<'a> {
    /// Pod fields.
    pub fields: FieldContext<'a>,
    /// The container.
    pub container: &'a Container,
    /// The pod's directory.
    pub dir: &'a PodDir,
    /// Secrets and ConfigMaps.
    pub objects: &'a dyn ObjectSource,
    /// Node resources.
    pub node: &'a NodeResources,
    /// The image map.
    pub images: &'a ImageMap,
    /// The API server (for `KUBERNETES_SERVICE_*`).
    pub api: &'a ApiAccess,
    /// Whether the pod has a kubeconfig (sets `KUBECONFIG`).
    pub kubeconfig: bool,
    /// The kubelet's `PATH`.
    pub path_env: &'a str,
}

/// A prepared launch and what probes of this container need.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// How to start the process.
    pub spec: LaunchSpec,
    /// The container's path rules (exec probes).
    pub rewriter: PathRewriter,
    /// The image entry (exec probes resolve their executable the same way).
    pub image: ImageEntry,
}

/// Prepares the launch of `inputs.container`.
pub fn prepare(inputs: &LaunchInputs<'_>) -> Result<Prepared, LaunchError> {
    let c = inputs.container;
    let image_ref = c.image.as_deref().unwrap_or_default();
    let image = inputs.images.lookup(image_ref).cloned().ok_or_else(|| {
        LaunchError::Image(format!(
            "image {image_ref:?} is not in the process kubelet's image map"
        ))
    })?;
    let entries = env::collect(&EnvInputs {
        fields: inputs.fields,
        container: c,
        objects: inputs.objects,
        node: inputs.node,
        base: base_env(inputs),
    })
    .map_err(LaunchError::Config)?;
    let (rewriter, create_dirs) = mounts(inputs, &entries).map_err(LaunchError::Config)?;
    let home = inputs.dir.root().to_string_lossy().into_owned();
    let env = env::finalize(&entries, &rewriter, &home);
    let lookup = |name: &str| env::lookup(&env, name);
    let command: Vec<String> = c
        .command
        .iter()
        .flatten()
        .map(|s| expand(&rewriter.rewrite(s), lookup))
        .collect();
    let args: Vec<String> = c
        .args
        .iter()
        .flatten()
        .map(|s| expand(&rewriter.rewrite(s), lookup))
        .collect();
    let program = images::resolve(
        image_ref,
        &image,
        &command,
        &args,
        inputs.path_env,
        &images::is_executable,
    )
    .map_err(LaunchError::Start)?;
    let cwd = match c.working_dir.as_deref().filter(|w| !w.is_empty()) {
        Some(w) => PathBuf::from(rewriter.rewrite(w)),
        None => inputs.dir.root().to_path_buf(),
    };
    let mut create_dirs = create_dirs;
    if cwd.starts_with(inputs.dir.root()) {
        create_dirs.push(cwd.clone());
    } else if !cwd.is_dir() {
        return Err(LaunchError::Start(format!(
            "working directory {cwd:?} does not exist on the host \
             (only paths under volume mounts are rewritten)"
        )));
    }
    let spec = LaunchSpec {
        program: program.path,
        args: program.args,
        env,
        cwd,
        create_dirs,
        log: inputs.dir.log(&c.name),
        termination_log: inputs.dir.termination_log(&c.name),
        pid_file: inputs.dir.pid_file(&c.name),
    };
    Ok(Prepared {
        spec,
        rewriter,
        image,
    })
}

/// Variables the harness sets before the pod spec's own.
fn base_env(inputs: &LaunchInputs<'_>) -> Vec<(String, String)> {
    let pod_name = inputs.fields.pod.metadata.name.clone().unwrap_or_default();
    let (host, port) = (&inputs.api.host, inputs.api.port);
    let mut base = vec![
        ("PATH".to_string(), inputs.path_env.to_string()),
        ("HOSTNAME".to_string(), pod_name),
        ("KUBERNETES_SERVICE_HOST".to_string(), host.clone()),
        ("KUBERNETES_SERVICE_PORT".to_string(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".to_string(), port.to_string()),
        ("KUBERNETES_PORT".to_string(), format!("tcp://{host}:{port}")),
    ];
    if inputs.kubeconfig {
        base.push((
            "KUBECONFIG".to_string(),
            inputs.dir.kubeconfig().to_string_lossy().into_owned(),
        ));
    }
    base
}

/// The container's rewrite rules, and the subPath directories to create.
fn mounts(inputs: &LaunchInputs<'_>, entries: &[EnvEntry]) -> Result<(PathRewriter, Vec<PathBuf>), String> {
    let c = inputs.container;
    let volumes = inputs
        .fields
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    let raw = |name: &str| {
        entries
            .iter()
            .rev()
            .find(|e| e.name == name)
            .map(|e| e.value.clone())
    };
    let mut rules = Vec::new();
    let mut create = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let volume = volumes
            .iter()
            .find(|v| v.name == m.name)
            .ok_or_else(|| format!("volumeMount {:?}: the pod has no such volume", m.name))?;
        let base = match &volume.host_path {
            Some(hp) => PathBuf::from(&hp.path),
            None => inputs.dir.volume(&volume.name),
        };
        let sub = match (&m.sub_path, &m.sub_path_expr) {
            (Some(s), _) if !s.is_empty() => s.clone(),
            (_, Some(e)) if !e.is_empty() => expand(e, raw),
            _ => String::new(),
        };
        let target = if sub.is_empty() {
            base
        } else {
            let target = join_sub_path(&base, &sub)?;
            if volume.empty_dir.is_some() || volume.host_path.is_some() {
                create.push(target.clone());
            }
            target
        };
        rules.push((m.mount_path.clone(), target));
    }
    let termination = c.termination_message_path.as_deref().filter(|p| !p.is_empty());
    let termination = termination.unwrap_or(DEFAULT_TERMINATION_MESSAGE_PATH);
    rules.push((termination.to_string(), inputs.dir.termination_log(&c.name)));
    Ok((PathRewriter::new(rules), create))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::apiserver::CaSource;
    use crate::kubelet::objects::FakeObjects;
    use k8s_openapi::api::core::v1::Pod;
    use std::path::Path;

    const POD: &str = "/s/pods/ns_p_u";

    fn pod(container: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [container], "volumes": [
                {"name": "models", "emptyDir": {}},
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "host", "hostPath": {"path": "/srv/shared"}},
            ]}
        }))
        .unwrap()
    }

    fn check(container: serde_json::Value, expected: Result<(&str, &[&str], &str), LaunchError>) {
        let pod = pod(container);
        let spec = &pod.spec.as_ref().unwrap().containers[0];
        let images = ImageMap::parse("images:\n  mf/shell:\n    binDir: /nonexistent\n").unwrap();
        let api = ApiAccess {
            server: "https://127.0.0.1:6443".into(),
            host: "127.0.0.1".into(),
            port: 6443,
            ca: CaSource::None,
        };
        let node = NodeResources {
            cpu: 1.0,
            memory: 1.0,
            ephemeral_storage: 1.0,
        };
        let dir = PodDir::new(Path::new("/s"), "ns", "p", "u");
        let inputs = LaunchInputs {
            fields: FieldContext {
                pod: &pod,
                pod_ip: "127.1.0.9",
                host_ip: "127.0.0.1",
            },
            container: spec,
            dir: &dir,
            objects: &FakeObjects::default(),
            node: &node,
            images: &images,
            api: &api,
            kubeconfig: true,
            path_env: "/usr/bin:/bin",
        };
        let got = prepare(&inputs).map(|p| (p.spec.program, p.spec.args, p.spec.cwd, p.spec.env));
        match (got, expected) {
            (Ok((program, args, cwd, env)), Ok((want_program, want_args, want_cwd))) => {
                assert!(program.ends_with(want_program), "{program:?}");
                assert_eq!(args, want_args.iter().map(|s| s.to_string()).collect::<Vec<_>>());
                assert_eq!(cwd, PathBuf::from(want_cwd));
                let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                assert_eq!(get("KUBECONFIG"), Some(format!("{POD}/kubeconfig")));
                assert_eq!(get("KUBERNETES_SERVICE_PORT").as_deref(), Some("6443"));
                assert_eq!(get("HOME"), Some(POD.to_string()));
            }
            (Err(got), Err(want)) => {
                let same_kind = std::mem::discriminant(&got) == std::mem::discriminant(&want);
                assert!(same_kind, "{got:?} vs {want:?}");
            }
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn launches_rewrite_expand_and_resolve() {
        use serde_json::json;
        check(
            json!({"name": "c", "image": "mf/shell:1", "command": ["sh", "-c"],
                   "args": ["cat /etc/app/app.yaml > /dev/termination-log; ls $(M)/x /srv/shared/y /models2"],
                   "env": [{"name": "M", "value": "/models"}],
                   "volumeMounts": [{"name": "models", "mountPath": "/models"},
                                    {"name": "cfg", "mountPath": "/etc/app/app.yaml", "subPath": "app.yaml"},
                                    {"name": "host", "mountPath": "/data"}]}),
            Ok((
                "sh",
                &[
                    "-c",
                    "cat /s/pods/ns_p_u/volumes/cfg/app.yaml > /s/pods/ns_p_u/containers/c/termination-log; \
                     ls /s/pods/ns_p_u/volumes/models/x /srv/shared/y /models2",
                ],
                POD,
            )),
        );
        check(
            json!({"name": "c", "image": "mf/shell", "command": ["/bin/sh"], "workingDir": "/models/w",
                   "args": ["--dir=/data/$(POD)", "$$(POD)"],
                   "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                   "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "host", "mountPath": "/data"}]}),
            Ok((
                "sh",
                &["--dir=/srv/shared/p", "$(POD)"],
                "/s/pods/ns_p_u/volumes/models/w",
            )),
        );
        check(
            json!({"name": "c", "image": "other/image"}),
            Err(LaunchError::Image(String::new())),
        );
        check(
            json!({"name": "c", "image": "mf/shell", "command": ["sh"], "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}),
            Err(LaunchError::Config(String::new())),
        );
        check(
            json!({"name": "c", "image": "mf/shell", "command": ["sh"], "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
            Err(LaunchError::Config(String::new())),
        );
        check(
            json!({"name": "c", "image": "mf/shell"}),
            Err(LaunchError::Start(String::new())),
        );
        check(
            json!({"name": "c", "image": "mf/shell", "command": ["no-such-tool"]}),
            Err(LaunchError::Start(String::new())),
        );
        check(
            json!({"name": "c", "image": "mf/shell", "command": ["sh"], "workingDir": "/no/such/dir"}),
            Err(LaunchError::Start(String::new())),
        );
    }
}
