//! The runtime `Deployment`: an init container (`modelfleet-runtime fetch`) that verifies the model into
//! a volume, then `modelfleet-runtime serve` on it.
//!
//! Invariants: rolling updates never reduce serving capacity (`maxUnavailable: 0`), so a bad new revision
//! (e.g. a digest mismatch in its init container) leaves the old ReplicaSet serving; the tenants Secret is
//! mounted as a directory (not copied, not `subPath`) so key rotation reaches running pods; so is the
//! adapters ConfigMap, and the template carries no hash of it, so adding an adapter never restarts a pod
//! (running pods get it through the admin API, new ones from the file before they turn ready);
//! `replicas` is a parameter — the caller decides it from spec or autoscaler, nothing else writes it;
//! both containers run as a non-root user without privilege escalation, capabilities or a writable root
//! file system (they write only to their volumes, each with a `sizeLimit` the fetches also respect);
//! the node's shared model cache is mounted only for namespaces the cluster admin opted in; a
//! terminating pod keeps serving for `preStop` seconds before SIGTERM so endpoints drop it first.
//! A speculative draft model is fetched and verified by a second init container into its own volume
//! (with the same limits and security), and `serve` checks its digest again at start-up.

use super::owned_meta;
use crate::config::{ModelCache, OperatorConfig, quantity_bytes};
use crate::labels::{
    ADMIN_PORT, DIGEST_ANNOTATION, FETCH_CONTAINER, HTTP_PORT, METRICS_PORT, RUNTIME_CONTAINER,
    adapters_configmap_name, admin_secret_name, selector_labels, workload_name,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, HostPathVolumeSource, Lifecycle, LifecycleHandler, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceFieldSelector, SeccompProfile, SecretVolumeSource, SecurityContext, SleepAction, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use modelfleet_crds::ModelDeployment;
use modelfleet_crds::model_deployment::{
    PrefixCacheScope, RuntimeSpec, SpeculativeConfigSpec, SpeculativeMethod,
};
use std::collections::BTreeMap;

/// Where the verified model lives in the pod.
pub const MODEL_DIR: &str = "/var/lib/modelfleet/model";
/// Where the verified speculative draft model lives in the pod.
pub const DRAFT_DIR: &str = "/var/lib/modelfleet/draft";
/// The init container that fetches the draft model.
pub const FETCH_DRAFT_CONTAINER: &str = "fetch-draft";
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
/// A small writable scratch directory, the containers' `TMPDIR` (the root file system is read-only).
/// Not `/tmp` itself: a harness that rewrites mount paths in arguments would rewrite every `/tmp/…`.
pub const TMP_DIR: &str = "/var/lib/modelfleet/tmp";
/// `sizeLimit` of the scratch (`TMPDIR`) volume.
pub const TMP_SIZE_LIMIT: &str = "64Mi";

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
                    init_containers: Some(init_containers(md, &runtime, &image, cfg)),
                    containers: vec![runtime_container(md, &runtime, &image, cfg)],
                    volumes: Some(volumes(md, &runtime, cfg)),
                    termination_grace_period_seconds: Some(
                        cfg.termination_grace_seconds + cfg.pre_stop_seconds.max(0),
                    ),
                    automount_service_account_token: Some(false),
                    security_context: Some(pod_security(cfg)),
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

/// The shared model cache, if `md`'s namespace may mount it.
fn shared_cache<'a>(md: &ModelDeployment, cfg: &'a OperatorConfig) -> Option<&'a ModelCache> {
    let ns = md.metadata.namespace.as_deref().unwrap_or_default();
    (cfg.model_cache != ModelCache::None && cfg.model_cache_namespaces.includes(ns))
        .then_some(&cfg.model_cache)
}

/// Non-root, with a fixed user and group (volumes are group-owned by it: `fsGroup`), the runtime's
/// default seccomp profile.
fn pod_security(cfg: &OperatorConfig) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(cfg.run_as_user),
        run_as_group: Some(cfg.run_as_user),
        fs_group: Some(cfg.run_as_user),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Every container: no privilege escalation, no capabilities, a read-only root file system.
fn container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The model's fetch, and the draft model's when speculative decoding uses one.
fn init_containers(
    md: &ModelDeployment,
    runtime: &RuntimeSpec,
    image: &str,
    cfg: &OperatorConfig,
) -> Vec<Container> {
    let m = &md.spec.model;
    let mut out = vec![fetch_container(
        md,
        FETCH_CONTAINER,
        (&m.uri, &m.digest),
        ("model", MODEL_DIR),
        image,
        cfg,
    )];
    if let Some(d) = draft_model(runtime) {
        out.push(fetch_container(
            md,
            FETCH_DRAFT_CONTAINER,
            (&d.uri, &d.digest),
            ("draft-model", DRAFT_DIR),
            image,
            cfg,
        ));
    }
    out
}

fn draft_model(runtime: &RuntimeSpec) -> Option<&modelfleet_crds::model_deployment::DraftModelSource> {
    runtime
        .speculative_config
        .as_ref()
        .filter(|s| s.method == SpeculativeMethod::DraftModel)
        .and_then(|s| s.draft_model.as_ref())
}

fn fetch_container(
    md: &ModelDeployment,
    name: &str,
    (uri, digest): (&str, &str),
    (volume, dest): (&str, &str),
    image: &str,
    cfg: &OperatorConfig,
) -> Container {
    let mut args: Vec<String> = vec![
        "fetch".into(),
        "--uri".into(),
        uri.into(),
        "--digest".into(),
        digest.into(),
        "--dest".into(),
        dest.into(),
        // Explicit, so harnesses that rewrite paths in args (the e2e process kubelet) see it too.
        "--termination-log".into(),
        "/dev/termination-log".into(),
    ];
    let mut mounts = vec![mount(volume, dest, false), mount("tmp", TMP_DIR, false)];
    if shared_cache(md, cfg).is_some() {
        args.extend(["--cache".to_string(), CACHE_DIR.to_string()]);
        mounts.push(mount("model-cache", CACHE_DIR, false));
    }
    if let Some(bytes) = cfg.model_volume_size_limit.as_deref().and_then(quantity_bytes) {
        args.extend(["--max-bytes".to_string(), bytes.to_string()]);
    }
    Container {
        name: name.into(),
        image: Some(image.into()),
        args: Some(args),
        env: Some(vec![tmpdir_env()]),
        volume_mounts: Some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(container_security()),
        ..Default::default()
    }
}

fn tmpdir_env() -> EnvVar {
    EnvVar {
        name: "TMPDIR".into(),
        value: Some(TMP_DIR.into()),
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

/// `MODELFLEET_MEMORY_LIMIT_BYTES` from the downward API's `limits.memory`, so the runtime sizes its KV
/// pool from the container's limit (`serve --memory-limit-bytes`). Only with a memory limit in the
/// spec: without one the downward API would report the node's allocatable memory.
fn memory_limit_env(runtime: &RuntimeSpec) -> Option<EnvVar> {
    let limits = runtime.resources.as_ref()?.limits.as_ref()?;
    limits.get("memory")?;
    Some(EnvVar {
        name: "MODELFLEET_MEMORY_LIMIT_BYTES".into(),
        value_from: Some(EnvVarSource {
            resource_field_ref: Some(ResourceFieldSelector {
                container_name: Some(RUNTIME_CONTAINER.into()),
                resource: "limits.memory".into(),
                divisor: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
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
    if let Some(bytes) = cfg.adapter_store_size_limit.as_deref().and_then(quantity_bytes) {
        args.push("--max-adapter-bytes".into());
        args.push(bytes.to_string());
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
    if let Some(spec) = &runtime.speculative_config {
        args.push("--speculative-config".into());
        args.push(speculative_json(spec));
    }
    args.extend(runtime.extra_args.iter().cloned());
    args
}

/// `--speculative-config` in vLLM's keys; a draft model is the verified copy in [`DRAFT_DIR`], with its
/// digest so `serve` checks it again.
fn speculative_json(s: &SpeculativeConfigSpec) -> String {
    let mut doc = serde_json::Map::new();
    doc.insert("num_speculative_tokens".into(), s.num_speculative_tokens.into());
    match (&s.method, &s.draft_model) {
        (SpeculativeMethod::DraftModel, Some(d)) => {
            doc.insert("method".into(), "draft_model".into());
            doc.insert("model".into(), DRAFT_DIR.into());
            doc.insert("model_digest".into(), d.digest.clone().into());
        }
        _ => {
            doc.insert("method".into(), "ngram".into());
        }
    }
    let mut opt = |key: &str, v: Option<serde_json::Value>| {
        if let Some(v) = v {
            doc.insert(key.into(), v);
        }
    };
    opt("prompt_lookup_min", s.prompt_lookup_min.map(Into::into));
    opt("prompt_lookup_max", s.prompt_lookup_max.map(Into::into));
    opt("disable_by_batch_size", s.disable_by_batch_size.map(Into::into));
    opt("min_acceptance_rate", s.min_acceptance_rate.map(Into::into));
    serde_json::Value::Object(doc).to_string()
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
        tmpdir_env(),
    ];
    env.extend(memory_limit_env(runtime));
    env.extend(runtime.env.iter().cloned());
    let mut mounts = vec![
        mount("model", MODEL_DIR, true),
        mount("admin-token", ADMIN_DIR, true),
        mount("adapters", ADAPTERS_DIR, true),
        mount("adapter-store", ADAPTER_STORE_DIR, false),
        mount("tmp", TMP_DIR, false),
    ];
    if md.spec.tenants.is_some() {
        mounts.push(mount("tenants", TENANTS_DIR, true));
    }
    if draft_model(runtime).is_some() {
        mounts.push(mount("draft-model", DRAFT_DIR, true));
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
        security_context: Some(container_security()),
        lifecycle: (cfg.pre_stop_seconds > 0).then(|| Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction {
                    seconds: cfg.pre_stop_seconds,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn empty_dir(name: &str, size_limit: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: size_limit.map(|q| Quantity(q.to_string())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn volumes(md: &ModelDeployment, runtime: &RuntimeSpec, cfg: &OperatorConfig) -> Vec<Volume> {
    let name = md.metadata.name.clone().unwrap_or_default();
    let mut volumes = vec![
        empty_dir("model", cfg.model_volume_size_limit.as_deref()),
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
        empty_dir("adapter-store", cfg.adapter_store_size_limit.as_deref()),
        empty_dir("tmp", Some(TMP_SIZE_LIMIT)),
    ];
    match shared_cache(md, cfg) {
        Some(ModelCache::HostPath(path)) => volumes.push(Volume {
            name: "model-cache".into(),
            host_path: Some(HostPathVolumeSource {
                path: path.display().to_string(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Default::default()
        }),
        Some(ModelCache::Pvc(claim)) => volumes.push(Volume {
            name: "model-cache".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        Some(ModelCache::None) | None => {}
    }
    if draft_model(runtime).is_some() {
        volumes.push(empty_dir("draft-model", cfg.model_volume_size_limit.as_deref()));
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
            ],
            "no shared cache unless the namespace opted in"
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
                "/var/lib/modelfleet/adapters",
                "--max-adapter-bytes",
                "2147483648"
            ]
        );
        let env: Vec<&str> = main
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(env, ["POD_IP", "POD_NAME", "POD_NAMESPACE", "TMPDIR"]);
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
            ["model", "admin-token", "adapters", "adapter-store", "tmp"]
        );
    }

    #[test]
    fn containers_are_locked_down_and_volumes_bounded() {
        let cfg = OperatorConfig {
            model_volume_size_limit: Some("20Gi".into()),
            ..Default::default()
        };
        let d = desired_deployment(&minimal(), &cfg, 1);
        let pod = pod_spec(&d);
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(
            (psc.run_as_non_root, psc.run_as_user, psc.fs_group),
            (Some(true), Some(65532), Some(65532))
        );
        assert_eq!(psc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        let init = &pod.init_containers.as_ref().unwrap()[0];
        for c in [init, &pod.containers[0]] {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(
                (
                    sc.allow_privilege_escalation,
                    sc.read_only_root_filesystem,
                    sc.privileged,
                    sc.run_as_non_root
                ),
                (Some(false), Some(true), Some(false), Some(true)),
                "{}",
                c.name
            );
            assert_eq!(
                sc.capabilities.as_ref().unwrap().drop.as_deref(),
                Some(&["ALL".to_string()][..])
            );
            let mounts = c.volume_mounts.as_ref().unwrap();
            assert!(mounts.iter().any(|m| m.mount_path == TMP_DIR), "{}", c.name);
        }
        let limit = |name: &str| {
            let v = pod
                .volumes
                .as_ref()
                .unwrap()
                .iter()
                .find(|v| v.name == name)
                .unwrap();
            v.empty_dir
                .as_ref()
                .unwrap()
                .size_limit
                .as_ref()
                .map(|q| q.0.clone())
        };
        assert_eq!(limit("model").as_deref(), Some("20Gi"));
        assert_eq!(limit("adapter-store").as_deref(), Some("2Gi"));
        assert_eq!(limit("tmp").as_deref(), Some(TMP_SIZE_LIMIT));
        let fetch_args = init.args.as_ref().unwrap().join(" ");
        assert!(fetch_args.contains("--max-bytes 21474836480"), "{fetch_args}");
        // A terminating pod serves on for the preStop delay, within the grace period.
        let pre_stop = pod.containers[0]
            .lifecycle
            .as_ref()
            .unwrap()
            .pre_stop
            .as_ref()
            .unwrap();
        assert_eq!(pre_stop.sleep.as_ref().unwrap().seconds, 5);
        assert_eq!(pod.termination_grace_period_seconds, Some(65));
        let none = OperatorConfig {
            pre_stop_seconds: 0,
            ..Default::default()
        };
        let d = desired_deployment(&minimal(), &none, 1);
        assert!(pod_spec(&d).containers[0].lifecycle.is_none());
    }

    #[test]
    fn the_shared_cache_is_mounted_only_in_namespaces_that_opted_in() {
        use crate::config::CacheNamespaces;
        let has_cache = |namespaces: CacheNamespaces| {
            let cfg = OperatorConfig {
                model_cache_namespaces: namespaces,
                ..Default::default()
            };
            let d = desired_deployment(&minimal(), &cfg, 1);
            let pod = pod_spec(&d);
            let volume = pod
                .volumes
                .as_ref()
                .unwrap()
                .iter()
                .any(|v| v.name == "model-cache");
            let flag = pod.init_containers.as_ref().unwrap()[0]
                .args
                .as_ref()
                .unwrap()
                .contains(&"--cache".to_string());
            assert_eq!(volume, flag);
            volume
        };
        assert!(!has_cache(CacheNamespaces::None));
        assert!(!has_cache(CacheNamespaces::Listed(vec!["other".into()])));
        assert!(has_cache(CacheNamespaces::Listed(vec!["serving".into()])));
        assert!(has_cache(CacheNamespaces::All));
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
            model_cache_namespaces: crate::config::CacheNamespaces::All,
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
    fn speculative_config_becomes_the_flag_and_a_draft_model_a_verified_fetch() {
        let ngram = md(&format!(
            "  model:\n    uri: file:///m\n    digest: \"{DIGEST}\"\n  runtime:\n    speculativeConfig:\n      \
             method: Ngram\n      numSpeculativeTokens: 4\n      promptLookupMax: 5\n      disableByBatchSize: 8\n"
        ));
        let args = serve_args(
            &ngram,
            ngram.spec.runtime.as_ref().unwrap(),
            &OperatorConfig::default(),
        );
        let i = args.iter().position(|a| a == "--speculative-config").unwrap();
        let doc: serde_json::Value = serde_json::from_str(&args[i + 1]).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5,
                               "disable_by_batch_size": 8})
        );
        assert_eq!(
            pod_spec(&desired_deployment(&ngram, &OperatorConfig::default(), 1))
                .init_containers
                .as_ref()
                .unwrap()
                .len(),
            1
        );
        let draft_digest = format!("sha256:{}", "b".repeat(64));
        let draft = md(&format!(
            "  model:\n    uri: file:///m\n    digest: \"{DIGEST}\"\n  runtime:\n    speculativeConfig:\n      \
             method: DraftModel\n      numSpeculativeTokens: 3\n      draftModel:\n        uri: hf://org/small@v1\n        \
             digest: \"{draft_digest}\"\n"
        ));
        let d = desired_deployment(&draft, &OperatorConfig::default(), 1);
        let pod = pod_spec(&d);
        let fetch = &pod.init_containers.as_ref().unwrap()[1];
        assert_eq!(fetch.name, FETCH_DRAFT_CONTAINER);
        let fa = fetch.args.as_ref().unwrap().join(" ");
        assert!(
            fa.contains(&format!(
                "--uri hf://org/small@v1 --digest {draft_digest} --dest {DRAFT_DIR}"
            )),
            "{fa}"
        );
        let args = pod.containers[0].args.as_ref().unwrap();
        let i = args.iter().position(|a| a == "--speculative-config").unwrap();
        let doc: serde_json::Value = serde_json::from_str(&args[i + 1]).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({"method": "draft_model", "num_speculative_tokens": 3, "model": DRAFT_DIR,
                               "model_digest": draft_digest})
        );
        let mounts = pod.containers[0].volume_mounts.as_ref().unwrap();
        assert!(
            mounts
                .iter()
                .any(|m| m.name == "draft-model" && m.mount_path == DRAFT_DIR && m.read_only == Some(true))
        );
        assert!(
            pod.volumes
                .as_ref()
                .unwrap()
                .iter()
                .any(|v| v.name == "draft-model")
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
    fn a_memory_limit_reaches_the_runtime_through_the_downward_api() {
        let with_limit = md(&format!(
            "  model:\n    uri: file:///m\n    digest: \"{DIGEST}\"\n  runtime:\n    resources:\n      limits:\n        \
             memory: 2Gi\n      requests:\n        memory: 1Gi\n"
        ));
        let d = desired_deployment(&with_limit, &OperatorConfig::default(), 1);
        let main = &pod_spec(&d).containers[0];
        let env = main
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == "MODELFLEET_MEMORY_LIMIT_BYTES")
            .expect("the limit is passed");
        let field = env
            .value_from
            .as_ref()
            .unwrap()
            .resource_field_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (field.container_name.as_deref(), field.resource.as_str()),
            (Some(RUNTIME_CONTAINER), "limits.memory")
        );
        assert!(
            env.value.is_none() && field.divisor.is_none(),
            "bytes, from the API server"
        );
        // Without a limit the downward API would report the node's memory: nothing is passed, and the
        // runtime falls back to its cgroup or its default pool.
        for spec in [
            "",
            "  runtime:\n    resources:\n      requests:\n        memory: 1Gi\n",
        ] {
            let m = md(&format!(
                "  model:\n    uri: file:///m\n    digest: \"{DIGEST}\"\n{spec}"
            ));
            let d = desired_deployment(&m, &OperatorConfig::default(), 1);
            let env = pod_spec(&d).containers[0].env.clone().unwrap();
            assert!(
                env.iter().all(|e| e.name != "MODELFLEET_MEMORY_LIMIT_BYTES"),
                "{spec}"
            );
        }
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
