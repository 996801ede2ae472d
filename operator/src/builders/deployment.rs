//! The runtime `Deployment`: an init container (`modelfleet-runtime fetch`) that verifies the model into
//! a volume, then `modelfleet-runtime serve` on it.
//!
//! Invariants: rolling updates never reduce serving capacity (`maxUnavailable: 0`), so a bad new revision
//! (e.g. a digest mismatch in its init container) leaves the old ReplicaSet serving; the tenants Secret is
//! mounted as a directory (not copied, not `subPath`) so key rotation reaches running pods; so is the
//! adapters ConfigMap, and the template carries no hash of it, so adding an adapter never restarts a pod
//! (running pods get it through the admin API, new ones from the file before they turn ready);
//! `replicas` is a parameter — the caller decides it from spec or autoscaler, nothing else writes it.

use super::owned_meta;
use crate::config::{ModelCache, OperatorConfig};
use crate::labels::{
    ADMIN_PORT, DIGEST_ANNOTATION, FETCH_CONTAINER, HTTP_PORT, METRICS_PORT, RUNTIME_CONTAINER,
    adapters_configmap_name, admin_secret_name, selector_labels, workload_name,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, HostPathVolumeSource, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSpec,
    PodTemplateSpec, Probe, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use modelfleet_crds::ModelDeployment;
use modelfleet_crds::model_deployment::{PrefixCacheScope, RuntimeSpec};
use std::collections::BTreeMap;

/// Where the verified model lives in the pod.
pub const MODEL_DIR: &str = "/var/lib/modelfleet/model";
/// Where the digest-keyed cache is mounted.
pub const CACHE_DIR: &str = "/var/lib/modelfleet/cache";
/// Where the admin-token Secret is mounted.
pub const ADMIN_DIR: &str = "/etc/modelfleet/admin";
/// Where the tenants Secret is mounted.
pub const TENANTS_DIR: &str = "/etc/modelfleet/tenants";
/// Where the adapters ConfigMap is mounted (a directory, so updates reach running pods).
pub const ADAPTERS_DIR: &str = "/etc/modelfleet/adapters";
/// Where a runtime pod stores the adapters it fetched and verified (an emptyDir).
pub const ADAPTER_STORE_DIR: &str = "/var/lib/modelfleet/adapters";

/// The served model name: `spec.model.servedName`, else the ModelDeployment's name.
pub fn served_name(md: &ModelDeployment) -> String {
    md.spec
        .model
        .served_name
        .clone()
        .unwrap_or_else(|| md.metadata.name.clone().unwrap_or_default())
}

/// The runtime Deployment for `md` with `replicas` pods.
pub fn desired_deployment(md: &ModelDeployment, cfg: &OperatorConfig, replicas: i32) -> Deployment {
    let name = md.metadata.name.clone().unwrap_or_default();
    let runtime = md.spec.runtime.clone().unwrap_or_default();
    let image = runtime.image.clone().unwrap_or_else(|| cfg.runtime_image.clone());
    let annotations = BTreeMap::from([
        ("prometheus.io/scrape".to_string(), "true".to_string()),
        ("prometheus.io/port".to_string(), METRICS_PORT.to_string()),
        ("prometheus.io/path".to_string(), "/metrics".to_string()),
        (DIGEST_ANNOTATION.to_string(), md.spec.model.digest.clone()),
    ]);
    let mut pod_labels = crate::labels::labels(&name);
    pod_labels.extend(selector_labels(&name));
    Deployment {
        metadata: owned_meta(md, workload_name(&name)),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector_labels(&name)),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            revision_history_limit: Some(5),
            progress_deadline_seconds: Some(600),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    init_containers: Some(vec![fetch_container(md, &image, &cfg.model_cache)]),
                    containers: vec![runtime_container(md, &runtime, &image, cfg)],
                    volumes: Some(volumes(md, &cfg.model_cache)),
                    termination_grace_period_seconds: Some(cfg.termination_grace_seconds),
                    automount_service_account_token: Some(false),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn fetch_container(md: &ModelDeployment, image: &str, cache: &ModelCache) -> Container {
    let mut args: Vec<String> = vec![
        "fetch".into(),
        "--uri".into(),
        md.spec.model.uri.clone(),
        "--digest".into(),
        md.spec.model.digest.clone(),
        "--dest".into(),
        MODEL_DIR.into(),
        // Explicit, so harnesses that rewrite paths in args (the e2e process kubelet) see it too.
        "--termination-log".into(),
        "/dev/termination-log".into(),
    ];
    let mut mounts = vec![mount("model", MODEL_DIR, false)];
    if *cache != ModelCache::None {
        args.extend(["--cache".to_string(), CACHE_DIR.to_string()]);
        mounts.push(mount("model-cache", CACHE_DIR, false));
    }
    Container {
        name: FETCH_CONTAINER.into(),
        image: Some(image.into()),
        args: Some(args),
        volume_mounts: Some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(5),
        ..Default::default()
    }
}

/// `serve` flags from the spec and the operator's settings; unset fields keep the runtime's defaults.
pub fn serve_args(md: &ModelDeployment, runtime: &RuntimeSpec, cfg: &OperatorConfig) -> Vec<String> {
    let mut args: Vec<String> = [
        "serve",
        "--model",
        MODEL_DIR,
        "--digest",
        &md.spec.model.digest,
        "--served-model-name",
        &served_name(md),
        "--port",
        &HTTP_PORT.to_string(),
        "--admin-port",
        &ADMIN_PORT.to_string(),
        "--admin-token-file",
        &format!("{ADMIN_DIR}/token"),
        "--adapters-file",
        &format!("{ADAPTERS_DIR}/{}", super::adapters::ADAPTERS_KEY),
        "--adapter-dir",
        ADAPTER_STORE_DIR,
    ]
    .map(String::from)
    .to_vec();
    if !cfg.adapter_file_roots.is_empty() {
        args.push("--adapter-file-roots".into());
        args.push(cfg.adapter_file_roots.join(","));
    }
    let mut flag = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            args.push(format!("--{name}"));
            args.push(v);
        }
    };
    if let Some(t) = &md.spec.tenants {
        flag("tenants", Some(format!("{TENANTS_DIR}/{}", t.secret_ref.key)));
    }
    flag("threads", runtime.threads.map(|v| v.to_string()));
    flag("max-model-len", runtime.max_model_len.map(|v| v.to_string()));
    flag("max-num-seqs", runtime.max_num_seqs.map(|v| v.to_string()));
    flag(
        "max-num-batched-tokens",
        runtime.max_num_batched_tokens.map(|v| v.to_string()),
    );
    let queue = runtime.queue.clone().unwrap_or_default();
    flag(
        "max-num-queued-reqs",
        queue.max_num_queued_reqs.map(|v| v.to_string()),
    );
    flag(
        "max-num-queued-tokens",
        queue.max_num_queued_tokens.map(|v| v.to_string()),
    );
    let kv = runtime.kv_cache.clone().unwrap_or_default();
    flag("block-size", kv.block_size.map(|v| v.to_string()));
    flag("num-kv-blocks", kv.num_blocks.map(|v| v.to_string()));
    let lora = runtime.lora.clone().unwrap_or_default();
    flag("max-loras", lora.max_loras.map(|v| v.to_string()));
    flag("max-cpu-loras", lora.max_cpu_loras.map(|v| v.to_string()));
    flag("max-lora-rank", lora.max_lora_rank.map(|v| v.to_string()));
    if let Some(pc) = &runtime.prefix_caching {
        if pc.enabled {
            args.push("--enable-prefix-caching".into());
            let scope = match pc.scope {
                PrefixCacheScope::Tenant => "tenant",
                PrefixCacheScope::Deployment => "deployment",
            };
            args.extend(["--prefix-cache-scope".to_string(), scope.to_string()]);
        } else {
            args.push("--no-enable-prefix-caching".into());
        }
    }
    args.extend(runtime.extra_args.iter().cloned());
    args
}

fn runtime_container(
    md: &ModelDeployment,
    runtime: &RuntimeSpec,
    image: &str,
    cfg: &OperatorConfig,
) -> Container {
    let mut env = vec![
        field_env("POD_IP", "status.podIP"),
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
    ];
    env.extend(runtime.env.iter().cloned());
    let mut mounts = vec![
        mount("model", MODEL_DIR, true),
        mount("admin-token", ADMIN_DIR, true),
        mount("adapters", ADAPTERS_DIR, true),
        mount("adapter-store", ADAPTER_STORE_DIR, false),
    ];
    if md.spec.tenants.is_some() {
        mounts.push(mount("tenants", TENANTS_DIR, true));
    }
    Container {
        name: RUNTIME_CONTAINER.into(),
        image: Some(image.into()),
        args: Some(serve_args(md, runtime, cfg)),
        env: Some(env),
        ports: Some(vec![
            ContainerPort {
                name: Some("http".into()),
                container_port: HTTP_PORT,
                ..Default::default()
            },
            ContainerPort {
                name: Some("admin".into()),
                container_port: ADMIN_PORT,
                ..Default::default()
            },
        ]),
        resources: runtime.resources.clone(),
        volume_mounts: Some(mounts),
        readiness_probe: Some(http_probe("/ready", 2, 3)),
        liveness_probe: Some(http_probe("/health", 10, 3)),
        // Loading a large model can take minutes; liveness only starts counting once it is up.
        startup_probe: Some(http_probe("/health", 2, 300)),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

fn volumes(md: &ModelDeployment, cache: &ModelCache) -> Vec<Volume> {
    let name = md.metadata.name.clone().unwrap_or_default();
    let mut volumes = vec![
        Volume {
            name: "model".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        Volume {
            name: "admin-token".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(admin_secret_name(&name)),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "adapters".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: adapters_configmap_name(&name),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "adapter-store".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
    ];
    match cache {
        ModelCache::HostPath(path) => volumes.push(Volume {
            name: "model-cache".into(),
            host_path: Some(HostPathVolumeSource {
                path: path.display().to_string(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Default::default()
        }),
        ModelCache::Pvc(claim) => volumes.push(Volume {
            name: "model-cache".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ModelCache::None => {}
    }
    if let Some(t) = &md.spec.tenants {
        volumes.push(Volume {
            name: "tenants".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(t.secret_ref.name.clone()),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    volumes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::fixtures::{DIGEST, md, minimal};

    fn pod_spec(d: &Deployment) -> &PodSpec {
        d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    #[test]
    fn minimal_deployment() {
        let d = desired_deployment(&minimal(), &OperatorConfig::default(), 2);
        assert_eq!(d.metadata.name.as_deref(), Some("smollm2"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("serving"));
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("ModelDeployment", Some(true))
        );
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(2));
        let rolling = spec.strategy.as_ref().unwrap().rolling_update.as_ref().unwrap();
        assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
        let pod = pod_spec(&d);
        let init = &pod.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            init.args.as_ref().unwrap(),
            &[
                "fetch",
                "--uri",
                "file:///models/smollm2.gguf",
                "--digest",
                DIGEST,
                "--dest",
                MODEL_DIR,
                "--termination-log",
                "/dev/termination-log",
                "--cache",
                CACHE_DIR
            ]
        );
        let main = &pod.containers[0];
        assert_eq!(
            main.args.as_ref().unwrap(),
            &[
                "serve",
                "--model",
                MODEL_DIR,
                "--digest",
                DIGEST,
                "--served-model-name",
                "smollm2",
                "--port",
                "8000",
                "--admin-port",
                "8001",
                "--admin-token-file",
                "/etc/modelfleet/admin/token",
                "--adapters-file",
                "/etc/modelfleet/adapters/adapters.json",
                "--adapter-dir",
                "/var/lib/modelfleet/adapters"
            ]
        );
        let env: Vec<&str> = main
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(env, ["POD_IP", "POD_NAME", "POD_NAMESPACE"]);
        assert_eq!(
            main.readiness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .as_deref(),
            Some("/ready")
        );
        assert_eq!(
            main.liveness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .as_deref(),
            Some("/health")
        );
        let annotations = d
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap();
        assert_eq!(annotations["prometheus.io/scrape"], "true");
        assert_eq!(annotations[DIGEST_ANNOTATION], DIGEST);
        let volumes: Vec<&str> = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(
            volumes,
            ["model", "admin-token", "adapters", "adapter-store", "model-cache"]
        );
    }

    #[test]
    fn spec_fields_become_flags_mounts_and_resources() {
        let md = md(&format!(
            "  model:\n    uri: hf://org/m@v1\n    digest: \"{DIGEST}\"\n    servedName: chat\n  runtime:\n    \
             image: registry/runtime:v2\n    threads: 4\n    maxNumSeqs: 64\n    queue:\n      maxNumQueuedReqs: 100\n    \
             kvCache:\n      blockSize: 32\n    prefixCaching:\n      enabled: true\n      scope: Deployment\n    \
             resources:\n      limits:\n        nvidia.com/gpu: \"1\"\n    extraArgs: [\"--seed-base\", \"7\"]\n    \
             env:\n    - name: RUST_LOG\n      value: debug\n  tenants:\n    secretRef:\n      name: keys\n"
        ));
        let cfg = OperatorConfig {
            model_cache: ModelCache::Pvc("models".into()),
            ..Default::default()
        };
        let d = desired_deployment(&md, &cfg, 1);
        let pod = pod_spec(&d);
        let main = &pod.containers[0];
        assert_eq!(main.image.as_deref(), Some("registry/runtime:v2"));
        let args = main.args.as_ref().unwrap().join(" ");
        for expected in [
            "--served-model-name chat",
            "--tenants /etc/modelfleet/tenants/tenants.yaml",
            "--threads 4",
            "--max-num-seqs 64",
            "--max-num-queued-reqs 100",
            "--block-size 32",
            "--enable-prefix-caching --prefix-cache-scope deployment",
        ] {
            assert!(args.contains(expected), "{expected:?} missing from {args}");
        }
        assert!(args.ends_with("--seed-base 7"), "extra args go last: {args}");
        let limits = main.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["nvidia.com/gpu"].0, "1");
        assert!(main.env.as_ref().unwrap().iter().any(|e| e.name == "RUST_LOG"));
        let tenants = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "tenants")
            .unwrap();
        assert_eq!(
            tenants.secret.as_ref().unwrap().secret_name.as_deref(),
            Some("keys")
        );
        let mount = main
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "tenants")
            .unwrap();
        assert!(
            mount.sub_path.is_none(),
            "a subPath mount would not see Secret rotation"
        );
        let cache = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "model-cache")
            .unwrap();
        assert_eq!(
            cache.persistent_volume_claim.as_ref().unwrap().claim_name,
            "models"
        );
    }

    #[test]
    fn no_cache_means_no_cache_flag_or_volume() {
        let cfg = OperatorConfig {
            model_cache: ModelCache::None,
            ..Default::default()
        };
        let d = desired_deployment(&minimal(), &cfg, 1);
        let pod = pod_spec(&d);
        assert!(
            !pod.init_containers.as_ref().unwrap()[0]
                .args
                .as_ref()
                .unwrap()
                .contains(&"--cache".to_string())
        );
        assert!(
            pod.volumes
                .as_ref()
                .unwrap()
                .iter()
                .all(|v| v.name != "model-cache")
        );
    }

    #[test]
    fn prefix_caching_off() {
        let md = md(&format!(
            "  model:\n    uri: file:///m\n    digest: \"{DIGEST}\"\n  runtime:\n    prefixCaching:\n      enabled: false\n"
        ));
        let args = serve_args(&md, md.spec.runtime.as_ref().unwrap(), &OperatorConfig::default());
        assert!(args.contains(&"--no-enable-prefix-caching".to_string()));
        assert!(!args.contains(&"--prefix-cache-scope".to_string()));
    }

    #[test]
    fn adapters_come_from_a_mounted_directory_and_never_restart_pods() {
        let d = desired_deployment(&minimal(), &OperatorConfig::default(), 1);
        let pod = pod_spec(&d);
        let volume = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "adapters")
            .unwrap();
        let cm = volume.config_map.as_ref().unwrap();
        assert_eq!(cm.name, "smollm2-adapters");
        assert_eq!(cm.optional, None, "a pod never starts without its adapter list");
        let store = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "adapter-store")
            .unwrap();
        assert!(store.empty_dir.is_some());
        let main = &pod.containers[0];
        let mounts = main.volume_mounts.as_ref().unwrap();
        let m = mounts.iter().find(|m| m.name == "adapters").unwrap();
        assert_eq!(
            (m.mount_path.as_str(), m.read_only, m.sub_path.as_deref()),
            (ADAPTERS_DIR, Some(true), None),
            "a directory mount (not subPath) so ConfigMap updates reach running pods"
        );
        let s = mounts.iter().find(|m| m.name == "adapter-store").unwrap();
        assert_eq!((s.mount_path.as_str(), s.read_only), (ADAPTER_STORE_DIR, None));
        let annotations = d
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap();
        assert!(
            annotations
                .keys()
                .all(|k| !k.contains("adapter") && !k.contains("config")),
            "no ConfigMap hash in the pod template: {annotations:?}"
        );
        let args = main.args.as_ref().unwrap();
        assert!(
            !args.contains(&"--adapter-file-roots".to_string()),
            "none by default"
        );
    }

    #[test]
    fn adapter_file_roots_are_the_operators_setting() {
        let cfg = OperatorConfig {
            adapter_file_roots: vec!["/srv/adapters".into(), "/mnt/shared".into()],
            ..Default::default()
        };
        let d = desired_deployment(&minimal(), &cfg, 1);
        let args = pod_spec(&d).containers[0].args.as_ref().unwrap().join(" ");
        assert!(
            args.contains("--adapter-file-roots /srv/adapters,/mnt/shared"),
            "{args}"
        );
    }
}
