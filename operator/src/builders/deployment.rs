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
//! (with the same limits and security), and `serve` checks its digest again at start-up. The pod
//! settings (node selector, tolerations, …, the `podTemplate` overlay) are merged in last
//! ([`super::placement`]), which refuses any change to what this module owns.

use super::placement::{self, PodTemplateError};
use super::{model_volume, owned_meta};
use crate::config::{ModelCache, OperatorConfig, quantity_bytes};
use crate::labels::{
    ADMIN_PORT, DIGEST_ANNOTATION, FETCH_CONTAINER, HTTP_PORT, METRICS_PORT, RUNTIME_CONTAINER,
    SOURCE_ANNOTATION, adapters_configmap_name, admin_secret_name, selector_labels, workload_name,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, HostPathVolumeSource, Lifecycle, LifecycleHandler, LocalObjectReference,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, ResourceFieldSelector, SeccompProfile, SecretVolumeSource, SecurityContext, SleepAction, Volume,
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

/// A hash of `spec.model` (16 hex digits): which pods were made for the model as it is now.
pub fn model_source_key(md: &ModelDeployment) -> String {
    use sha2::Digest as _;
    let json = serde_json::to_vec(&md.spec.model).unwrap_or_default();
    hex::encode(&sha2::Sha256::digest(&json)[..8])
}

/// The served model name: `spec.model.servedName`, else the ModelDeployment's name.
pub fn served_name(md: &ModelDeployment) -> String {
    md.spec
        .model
        .served_name
        .clone()
        .unwrap_or_else(|| md.metadata.name.clone().unwrap_or_default())
}

/// The runtime Deployment for `md` with `replicas` pods: the operator's pod template with the pod
/// settings (the chart's defaults, then the ModelDeployment's) merged in ([`placement`]), or why they
/// cannot be.
pub fn desired_deployment(
    md: &ModelDeployment,
    cfg: &OperatorConfig,
    replicas: i32,
) -> Result<Deployment, PodTemplateError> {
    let name = md.metadata.name.clone().unwrap_or_default();
    let runtime = md.spec.runtime.clone().unwrap_or_default();
    let template = placement::place(pod_template(md, &runtime, cfg), &cfg.pod_defaults, &runtime.pod)?;
    Ok(Deployment {
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
            template,
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The operator's own pod template (before the pod settings).
fn pod_template(md: &ModelDeployment, runtime: &RuntimeSpec, cfg: &OperatorConfig) -> PodTemplateSpec {
    let name = md.metadata.name.clone().unwrap_or_default();
    let image = runtime.image.clone().unwrap_or_else(|| cfg.runtime_image.clone());
    let annotations = BTreeMap::from([
        ("prometheus.io/scrape".to_string(), "true".to_string()),
        ("prometheus.io/port".to_string(), METRICS_PORT.to_string()),
        ("prometheus.io/path".to_string(), "/metrics".to_string()),
        (DIGEST_ANNOTATION.to_string(), md.spec.model.digest.clone()),
        (SOURCE_ANNOTATION.to_string(), model_source_key(md)),
    ]);
    let mut pod_labels = crate::labels::labels(&name);
    pod_labels.extend(selector_labels(&name));
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(annotations),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            init_containers: Some(init_containers(md, runtime, &image, cfg)),
            containers: vec![runtime_container(md, runtime, &image, cfg)],
            volumes: Some(volumes(md, runtime, cfg)),
            termination_grace_period_seconds: Some(
                cfg.termination_grace_seconds + cfg.pre_stop_seconds.max(0),
            ),
            automount_service_account_token: Some(false),
            security_context: Some(pod_security(cfg)),
            image_pull_secrets: pull_secrets(md, cfg),
            ..Default::default()
        }),
    }
}

/// The operator's pull secrets, and the model image's credentials when it is an image volume.
fn pull_secrets(md: &ModelDeployment, cfg: &OperatorConfig) -> Option<Vec<LocalObjectReference>> {
    let mut out: Vec<LocalObjectReference> = cfg
        .image_pull_secrets
        .iter()
        .map(|name| LocalObjectReference { name: name.clone() })
        .collect();
    for s in model_volume::pull_secrets(md, &model_volume::plan(md)) {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The node file roots this ModelDeployment's namespace mounts (none outside `--node-file-namespaces`).
fn node_file_roots<'a>(md: &ModelDeployment, cfg: &'a OperatorConfig) -> &'a [String] {
    let ns = md.metadata.namespace.as_deref().unwrap_or_default();
    if cfg.node_file_namespaces.includes(ns) {
        &cfg.node_file_roots
    } else {
        &[]
    }
}

/// The node file roots, read-only at their own paths (`file://` URIs name them as they are on the node).
fn node_file_mounts<'a>(
    md: &ModelDeployment,
    cfg: &'a OperatorConfig,
) -> impl Iterator<Item = VolumeMount> + 'a {
    node_file_roots(md, cfg)
        .iter()
        .enumerate()
        .map(|(i, root)| mount(&format!("node-files-{i}"), root, true))
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

/// The model's fetch (or check, for a mounted model), and the draft model's fetch when speculative
/// decoding uses one.
fn init_containers(
    md: &ModelDeployment,
    runtime: &RuntimeSpec,
    image: &str,
    cfg: &OperatorConfig,
) -> Vec<Container> {
    let plan = model_volume::plan(md);
    let mut model = fetch_container(
        md,
        FETCH_CONTAINER,
        model_volume::fetch_flags(md, &plan),
        model_volume::model_mount(&plan, true),
        image,
        cfg,
    );
    if let Some(mounts) = model.volume_mounts.as_mut() {
        mounts.extend(model_volume::secret_mounts(md));
    }
    if let Some(env) = model.env.as_mut() {
        env.push(field_env("POD_IP", "status.podIP"));
    }
    let mut out = vec![model];
    if let Some(d) = draft_model(runtime) {
        let flags = ["--uri", &d.uri, "--digest", &d.digest, "--dest", DRAFT_DIR]
            .map(String::from)
            .to_vec();
        out.push(fetch_container(
            md,
            FETCH_DRAFT_CONTAINER,
            flags,
            mount("draft-model", DRAFT_DIR, false),
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

/// A fetch container: `fetch` with `flags` (source, digest, destination or mount), the artifact's
/// volume mounted as `target`, the node cache and the operator's size limit when they apply.
fn fetch_container(
    md: &ModelDeployment,
    name: &str,
    flags: Vec<String>,
    target: VolumeMount,
    image: &str,
    cfg: &OperatorConfig,
) -> Container {
    let mut args: Vec<String> = vec!["fetch".into()];
    args.extend(flags);
    // Explicit, so harnesses that rewrite paths in args (the e2e process kubelet) see it too.
    args.extend([
        "--termination-log".to_string(),
        "/dev/termination-log".to_string(),
    ]);
    let mut mounts = vec![target, mount("tmp", TMP_DIR, false)];
    if shared_cache(md, cfg).is_some() {
        args.extend(["--cache".to_string(), CACHE_DIR.to_string()]);
        mounts.push(mount("model-cache", CACHE_DIR, false));
    }
    if let Some(bytes) = cfg.model_volume_size_limit.as_deref().and_then(quantity_bytes) {
        args.extend(["--max-bytes".to_string(), bytes.to_string()]);
    }
    mounts.extend(node_file_mounts(md, cfg));
    Container {
        name: name.into(),
        image: Some(image.into()),
        image_pull_policy: cfg.runtime_image_pull_policy.clone(),
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
        // The fetch container verified the bytes (or the mounted model) before this container started:
        // the runtime checks them again beside loading them, not before.
        "--verify-beside-load",
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
        // Explicit, as for `fetch`: a fatal reason (a panic, an engine failure) goes there, and
        // harnesses that rewrite paths in args (the e2e process kubelet) see it too.
        "--termination-log",
        "/dev/termination-log",
    ]
    .map(String::from)
    .to_vec();
    if let Some(task) = md.spec.model.task {
        args.extend(["--task".into(), task.flag().into()]);
    }
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
    flag("kv-cache-dtype", kv.dtype.map(|d| d.flag().to_string()));
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

/// The trace export of the operator's `--otlp-traces-endpoint`, and the pod's identity on its spans
/// (expanded from the `POD_*` variables before them). A ModelDeployment's own `env` comes later and
/// may override any of them.
fn tracing_env(md: &ModelDeployment, cfg: &OperatorConfig) -> Vec<EnvVar> {
    let Some(t) = &cfg.tracing else {
        return Vec::new();
    };
    let value = |name: &str, v: String| EnvVar {
        name: name.into(),
        value: Some(v),
        ..Default::default()
    };
    let mut env = vec![value("MODELFLEET_OTLP_TRACES_ENDPOINT", t.endpoint.clone())];
    if let Some(r) = t.sample_ratio {
        env.push(value("MODELFLEET_TRACE_SAMPLE_RATIO", r.to_string()));
    }
    env.push(value(
        "OTEL_RESOURCE_ATTRIBUTES",
        format!(
            "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),modelfleet.model_deployment={}",
            kube::ResourceExt::name_any(md)
        ),
    ));
    env
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
    env.extend(tracing_env(md, cfg));
    env.extend(memory_limit_env(runtime));
    env.extend(runtime.env.iter().cloned());
    let mut mounts = vec![
        model_volume::model_mount(&model_volume::plan(md), false),
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
    mounts.extend(node_file_mounts(md, cfg));
    Container {
        name: RUNTIME_CONTAINER.into(),
        image: Some(image.into()),
        image_pull_policy: cfg.runtime_image_pull_policy.clone(),
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
    let plan = model_volume::plan(md);
    let model = model_volume::model_volume(&plan)
        .unwrap_or_else(|| empty_dir("model", cfg.model_volume_size_limit.as_deref()));
    let mut volumes = vec![
        model,
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
    for (i, root) in node_file_roots(md, cfg).iter().enumerate() {
        volumes.push(Volume {
            name: format!("node-files-{i}"),
            host_path: Some(HostPathVolumeSource {
                path: root.clone(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        });
    }
    volumes.extend(model_volume::secret_volumes(md));
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
mod tests;
#[cfg(test)]
mod tracing_tests;
