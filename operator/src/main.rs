//! `modelfleet-operator`: the controller binary. Subcommands:
//! - `run` — the controllers: leader election on a Lease, then the ModelDeployment and LoraAdapter
//!   reconcilers, with `/metrics`, `/healthz` and `/readyz` on `--metrics-bind-address`.
//! - `crds [--out-dir DIR]` prints (or writes) the CRD YAML that `crds/` holds, generated from
//!   `modelfleet-crds`.

use clap::{Args, Parser, Subcommand};
use modelfleet_operator::config::{
    GatewayPods, ModelCache, NamespaceSet, OperatorConfig, RuntimeTracing, ServedNameScope, quantity_bytes,
};
use modelfleet_operator::scope::Scope;
use modelfleet_operator::telemetry::{Metrics, router};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Kubernetes operator for LLM model fleets.
#[derive(Parser, Debug)]
#[command(name = "modelfleet-operator", version = modelfleet_api::version::long(), about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller.
    Run(Box<RunArgs>),
    /// Print every CRD of the modelfleet.io API as YAML (pipe into `kubectl apply -f -`).
    Crds {
        /// Write one `<group>_<plural>.yaml` file per CRD into this directory instead of printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

/// Flags of `run`; each can also come from `MODELFLEET_<FLAG_IN_CAPS>`.
#[derive(Args, Debug)]
struct RunArgs {
    /// Image of modelfleet-runtime for ModelDeployments that do not name one (the chart passes the
    /// image it was given, by digest when pinned). Required: there is no public default.
    #[arg(long, env = "MODELFLEET_RUNTIME_IMAGE")]
    runtime_image: String,
    /// `imagePullPolicy` of runtime pods' containers (Always, IfNotPresent, Never); default: Kubernetes'.
    #[arg(long, env = "MODELFLEET_RUNTIME_IMAGE_PULL_POLICY", value_parser = ["Always", "IfNotPresent", "Never"])]
    runtime_image_pull_policy: Option<String>,
    /// Secrets (in each ModelDeployment's namespace) that runtime pods pull their image with.
    #[arg(long, env = "MODELFLEET_IMAGE_PULL_SECRETS", value_delimiter = ',')]
    image_pull_secrets: Vec<String>,
    /// Host directory for the digest-keyed model cache of runtime pods.
    #[arg(
        long,
        env = "MODELFLEET_MODEL_CACHE_HOST_PATH",
        default_value = "/var/lib/modelfleet/cache"
    )]
    model_cache_host_path: PathBuf,
    /// Use this PersistentVolumeClaim for the model cache instead of a host directory.
    #[arg(long, env = "MODELFLEET_MODEL_CACHE_PVC", conflicts_with = "no_model_cache")]
    model_cache_pvc: Option<String>,
    /// No model cache: every runtime pod downloads the model.
    #[arg(long, env = "MODELFLEET_NO_MODEL_CACHE")]
    no_model_cache: bool,
    /// Namespaces whose runtime pods mount the shared model cache (comma-separated; `*`: every
    /// namespace). Others fetch into their own volume only. Default: none.
    #[arg(long, env = "MODELFLEET_MODEL_CACHE_NAMESPACES", value_delimiter = ',')]
    model_cache_namespaces: Vec<String>,
    /// `sizeLimit` of each runtime pod's model volume (a quantity such as `20Gi`); `fetch` refuses a
    /// larger model (`--max-bytes`). Default: none (`fetch` is bounded by the volume's free space).
    #[arg(long, env = "MODELFLEET_MODEL_VOLUME_SIZE_LIMIT")]
    model_volume_size_limit: Option<String>,
    /// `sizeLimit` of each runtime pod's adapter store; also the most one adapter's download may take
    /// (`serve --max-adapter-bytes`). Empty: no limit.
    #[arg(long, env = "MODELFLEET_ADAPTER_STORE_SIZE_LIMIT", default_value = "2Gi")]
    adapter_store_size_limit: String,
    /// Seconds a terminating runtime pod keeps serving before SIGTERM (a `preStop` sleep, so endpoints
    /// and gateways drop it first); 0: none. Added to the termination grace period.
    #[arg(long, env = "MODELFLEET_PRE_STOP_SECONDS", default_value_t = 5)]
    pre_stop_seconds: i64,
    /// User and group id of runtime containers (non-root).
    #[arg(long, env = "MODELFLEET_RUNTIME_RUN_AS_USER", default_value_t = 65532)]
    runtime_run_as_user: i64,
    /// Namespaces the operator manages (comma-separated). Default: every namespace. With a list it
    /// watches only those, and needs rights only there (the chart's per-namespace Roles).
    #[arg(long, env = "MODELFLEET_NAMESPACES", value_delimiter = ',')]
    namespaces: Vec<String>,
    /// Directories under which runtime pods may read `file://` adapters (comma-separated; passed to every
    /// runtime pod as `--adapter-file-roots`). Empty: `file://` adapters are refused.
    #[arg(long, env = "MODELFLEET_ADAPTER_FILE_ROOTS", value_delimiter = ',')]
    adapter_file_roots: Vec<String>,
    /// Node directories (absolute, comma-separated) mounted read-only at the same path into every
    /// runtime pod, so `file://` models and adapters under them can be read (hostPath volumes).
    #[arg(long, env = "MODELFLEET_NODE_FILE_ROOTS", value_delimiter = ',')]
    node_file_roots: Vec<String>,
    /// Namespaces whose runtime pods mount the node file roots (comma-separated; `*`: every namespace;
    /// `team-*`: every namespace starting with `team-`). Others mount none, so the restricted Pod
    /// Security Standard can be enforced there.
    #[arg(
        long,
        env = "MODELFLEET_NODE_FILE_NAMESPACES",
        value_delimiter = ',',
        default_value = "*"
    )]
    node_file_namespaces: Vec<String>,
    /// Seconds runtime pods get to drain on SIGTERM.
    #[arg(long, env = "MODELFLEET_TERMINATION_GRACE_SECONDS", default_value_t = 60)]
    termination_grace_seconds: i64,
    /// Address of /metrics, /healthz and /readyz (default: $POD_IP:8080, else 127.0.0.1:8080).
    #[arg(long, env = "MODELFLEET_METRICS_BIND_ADDRESS")]
    metrics_bind_address: Option<String>,
    /// Run without leader election (a single replica).
    #[arg(long, env = "MODELFLEET_NO_LEADER_ELECT")]
    no_leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "modelfleet-system")]
    lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(long, env = "MODELFLEET_LEASE_NAME", default_value = "modelfleet-operator")]
    lease_name: String,
    /// Namespace of the fleet gateway's pods, whose pending requests scale deployments from zero
    /// (default: the operator's own namespace).
    #[arg(long, env = "MODELFLEET_GATEWAY_NAMESPACE")]
    gateway_namespace: Option<String>,
    /// Label selector of the fleet gateway's pods.
    #[arg(
        long,
        env = "MODELFLEET_GATEWAY_SELECTOR",
        default_value = "app.kubernetes.io/name=modelfleet-gateway"
    )]
    gateway_selector: String,
    /// Port of the fleet gateway pods' `/metrics`.
    #[arg(long, env = "MODELFLEET_GATEWAY_METRICS_PORT", default_value_t = 8081)]
    gateway_metrics_port: u16,
    /// Where a served name must be unique: `cluster` (one gateway for every namespace) or `namespace`
    /// (a gateway per namespace). Deployments sharing a name within it get `ServedNameConflict`.
    #[arg(long, env = "MODELFLEET_SERVED_NAME_SCOPE", value_enum, default_value_t = ServedNameScope::Cluster)]
    served_name_scope: ServedNameScope,
    /// Pod settings every runtime pod gets beneath its ModelDeployment's, as JSON with the fields of
    /// `spec.runtime`'s pod settings (`nodeSelector`, `tolerations`, `affinity`, …, `podTemplate`):
    /// the chart's `runtime.podDefaults`. Each ModelDeployment's merge over them (docs/user-guide.md).
    #[arg(long, env = "MODELFLEET_RUNTIME_POD_DEFAULTS")]
    runtime_pod_defaults: Option<String>,
    /// Serve `external.metrics.k8s.io/v1beta1` on this address (e.g. `0.0.0.0:6443`) for
    /// HorizontalPodAutoscalers of `External`-mode deployments; the chart's APIService points here.
    /// Unset: not served.
    #[arg(long, env = "MODELFLEET_EXTERNAL_METRICS_BIND_ADDRESS")]
    external_metrics_bind_address: Option<std::net::SocketAddr>,
    /// Directory of the external metrics' serving certificate (`tls.crt`, `tls.key`: a mounted
    /// `kubernetes.io/tls` Secret).
    #[arg(
        long,
        env = "MODELFLEET_EXTERNAL_METRICS_CERT_DIR",
        default_value = "/etc/modelfleet/external-metrics"
    )]
    external_metrics_cert_dir: PathBuf,
    /// This replica's identity in the Lease (default: $POD_NAME).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Logs and traces (docs/operations.md, "Traces"). The endpoint and ratio also go to every
    /// runtime pod, so a request's runtime spans reach the same collector.
    #[command(flatten)]
    telemetry: modelfleet_telemetry::TelemetryArgs,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds { out_dir: None } => {
            std::io::stdout().write_all(modelfleet_crds::all_crds_yaml().as_bytes())?;
        }
        Command::Crds { out_dir: Some(dir) } => {
            for crd in modelfleet_crds::crds() {
                let path = dir.join(modelfleet_crds::crd_file_name(&crd));
                std::fs::write(&path, modelfleet_crds::crd_yaml(&crd))?;
                eprintln!("wrote {}", path.display());
            }
        }
        Command::Run(args) => {
            let telemetry = modelfleet_telemetry::init("modelfleet-operator", &args.telemetry);
            if let Some(w) = &telemetry.warning {
                tracing::warn!("{w}");
            }
            let ran = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(run(*args));
            // The async workers are done: the export thread gets a bounded time for the last spans.
            telemetry.shutdown(std::time::Duration::from_secs(3));
            ran?;
        }
    }
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let scope = Scope::parse(&args.namespaces);
    let cfg = operator_config(&args)?;
    let identity = args
        .identity
        .unwrap_or_else(|| format!("modelfleet-operator-{}", std::process::id()));
    let bind = args.metrics_bind_address.unwrap_or_else(|| {
        format!(
            "{}:8080",
            std::env::var("POD_IP").unwrap_or_else(|_| "127.0.0.1".into())
        )
    });
    let metrics = Arc::new(Metrics::default());
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    tracing::info!(%bind, "serving /metrics, /healthz, /readyz");
    let server = axum::serve(listener, router(metrics.clone()));
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });

    let client = kube::Client::try_default().await?;
    metrics.ready.store(true, Ordering::Relaxed);
    // Every replica serves the external metrics (reads only), before and after it leads.
    if let Some(bind) = args.external_metrics_bind_address {
        spawn_external_metrics(client.clone(), bind, &args.external_metrics_cert_dir);
    }
    if !args.no_leader_elect {
        let mut lease = modelfleet_operator::leader::acquire(
            client.clone(),
            &args.lease_namespace,
            &args.lease_name,
            &identity,
        )
        .await?;
        metrics.leader.set(1);
        tokio::spawn(async move {
            while lease.changed().await.is_ok() {
                if !*lease.borrow() {
                    break;
                }
            }
            tracing::error!("lost the leader lease; exiting so a fresh follower takes its place");
            std::process::exit(1);
        });
    } else {
        metrics.leader.set(1);
    }
    tracing::info!(%identity, ?scope, "starting the ModelDeployment and LoraAdapter controllers");
    let controllers = async {
        tokio::join!(
            modelfleet_operator::controller::run(client.clone(), cfg, metrics.clone(), &identity, &scope),
            modelfleet_operator::lora::run(client, metrics, &identity, &scope),
        )
    };
    tokio::select! {
        _ = controllers => {}
        _ = terminated() => {
            tracing::info!("SIGTERM: stopping the controllers");
        }
    }
    Ok(())
}

/// SIGTERM or SIGINT.
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The operator's configuration from its flags, each checked (a bad one stops the operator naming it).
fn operator_config(args: &RunArgs) -> anyhow::Result<OperatorConfig> {
    let quantity = |flag: &str, q: Option<String>| -> anyhow::Result<Option<String>> {
        match q.map(|q| q.trim().to_string()).filter(|q| !q.is_empty()) {
            Some(q) if quantity_bytes(&q).is_none() => {
                anyhow::bail!(
                    "--{flag} {q:?}: expected a whole number of bytes such as 512Mi, 20Gi or 1000000"
                )
            }
            other => Ok(other),
        }
    };
    if args.pre_stop_seconds < 0 || args.runtime_run_as_user <= 0 {
        anyhow::bail!(
            "--pre-stop-seconds must be >= 0 (got {}) and --runtime-run-as-user > 0 (got {}; 0 is root)",
            args.pre_stop_seconds,
            args.runtime_run_as_user
        );
    }
    let cfg = OperatorConfig {
        runtime_image: args.runtime_image.clone(),
        runtime_image_pull_policy: args.runtime_image_pull_policy.clone(),
        image_pull_secrets: args
            .image_pull_secrets
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        model_cache: if args.no_model_cache {
            ModelCache::None
        } else if let Some(pvc) = &args.model_cache_pvc {
            ModelCache::Pvc(pvc.clone())
        } else {
            ModelCache::HostPath(args.model_cache_host_path.clone())
        },
        model_cache_namespaces: NamespaceSet::parse(&args.model_cache_namespaces),
        model_volume_size_limit: quantity("model-volume-size-limit", args.model_volume_size_limit.clone())?,
        adapter_store_size_limit: quantity(
            "adapter-store-size-limit",
            Some(args.adapter_store_size_limit.clone()),
        )?,
        termination_grace_seconds: args.termination_grace_seconds,
        pre_stop_seconds: args.pre_stop_seconds,
        run_as_user: args.runtime_run_as_user,
        adapter_file_roots: roots(args.adapter_file_roots.clone()),
        node_file_roots: node_roots(args.node_file_roots.clone())?,
        node_file_namespaces: NamespaceSet::parse(&args.node_file_namespaces),
        gateway: GatewayPods {
            namespace: args
                .gateway_namespace
                .clone()
                .unwrap_or_else(|| args.lease_namespace.clone()),
            selector: args.gateway_selector.clone(),
            metrics_port: args.gateway_metrics_port,
        },
        served_name_scope: args.served_name_scope,
        pod_defaults: pod_defaults(args.runtime_pod_defaults.as_deref())?,
        tracing: args
            .telemetry
            .otlp_traces_endpoint
            .clone()
            .filter(|e| !e.trim().is_empty())
            .map(|endpoint| RuntimeTracing {
                endpoint,
                sample_ratio: args.telemetry.trace_sample_ratio,
            }),
    };
    modelfleet_operator::builders::placement::check_defaults(&cfg)
        .map_err(|e| anyhow::anyhow!("--runtime-pod-defaults: {e}"))?;
    Ok(cfg)
}

/// Serves `external.metrics.k8s.io` on `bind` with the certificate in `cert_dir`, in a task.
fn spawn_external_metrics(client: kube::Client, bind: std::net::SocketAddr, cert_dir: &std::path::Path) {
    let settings = modelfleet_operator::external_metrics::Settings {
        bind,
        cert_file: cert_dir.join("tls.crt"),
        key_file: cert_dir.join("tls.key"),
    };
    let http = modelfleet_operator::autoscaler::metrics::http_client();
    tokio::spawn(async move {
        if let Err(e) = modelfleet_operator::external_metrics::run(client, http, settings).await {
            tracing::error!(error = %e, "external metrics stopped");
        }
    });
}

/// `--runtime-pod-defaults`: pod settings as JSON, every key one of theirs.
fn pod_defaults(json: Option<&str>) -> anyhow::Result<modelfleet_crds::placement::PodSettings> {
    let Some(json) = json.map(str::trim).filter(|j| !j.is_empty()) else {
        return Ok(Default::default());
    };
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| anyhow::anyhow!("--runtime-pod-defaults is not JSON: {e}"))?;
    let known = modelfleet_crds::placement::POD_SETTINGS_FIELDS;
    for key in value.as_object().into_iter().flat_map(|o| o.keys()) {
        if !known.contains(&key.as_str()) {
            anyhow::bail!(
                "--runtime-pod-defaults: unknown field {key:?} (known: {})",
                known.join(", ")
            );
        }
    }
    serde_json::from_value(value).map_err(|e| anyhow::anyhow!("--runtime-pod-defaults: {e}"))
}

/// A comma-separated list's entries, trimmed, without empty ones.
fn roots(list: Vec<String>) -> Vec<String> {
    list.into_iter()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
        .collect()
}

/// `--node-file-roots`: absolute paths, none of them `/` (that would mount the node's whole tree).
fn node_roots(list: Vec<String>) -> anyhow::Result<Vec<String>> {
    let list = roots(list);
    for r in &list {
        let trimmed = r.trim_end_matches('/');
        if !r.starts_with('/') || trimmed.is_empty() || r.split('/').any(|p| p == "..") {
            anyhow::bail!(
                "--node-file-roots {r:?}: expected absolute node directories other than / (without ..), e.g. /srv/models"
            );
        }
    }
    Ok(list)
}
