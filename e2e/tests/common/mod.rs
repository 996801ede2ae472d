//! Helpers shared by the end-to-end scenarios. They talk to the cluster that `e2e/cluster up` started
//! (found through `KUBECONFIG`, `MF_PROMETHEUS_URL` and `PATH` from `e2e/cluster env`), with the real
//! kubectl and a real kube client. Nothing here is mocked.
#![allow(dead_code)] // each test binary uses its own subset

pub mod affinity;
pub mod delivery;
pub mod fleet;
pub mod load;
pub mod ramp;
pub mod tracing;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use std::future::Future;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The repository root (for `crds/`, manifests).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn require_cluster() {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG is not set: start the cluster with `e2e/cluster up` and `eval \"$(e2e/cluster env)\"` \
         (or run `make e2e`)"
    );
}

/// Runs kubectl with `args` (and `stdin`, if any) and returns its output.
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> Output {
    require_cluster();
    let mut cmd = Command::new("kubectl");
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd
        .spawn()
        .expect("kubectl on PATH (eval \"$(e2e/cluster env)\")");
    if let Some(input) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Runs kubectl and panics with its stderr unless it succeeds; returns stdout.
pub fn kubectl_ok(args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(args, stdin);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A kube client for the local cluster.
pub async fn client() -> kube::Client {
    require_cluster();
    let _ = rustls::crypto::ring::default_provider().install_default();
    kube::Client::try_default()
        .await
        .expect("kube client from KUBECONFIG")
}

/// A plain HTTP client (pod IPs and Prometheus are plain HTTP on loopback).
pub fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// A namespace for one test, deleted (without waiting) when dropped.
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    pub fn new(prefix: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("e2e-{prefix}-{:x}", nanos ^ std::process::id());
        kubectl_ok(&["create", "namespace", &name], None);
        TestNamespace { name }
    }

    /// A namespace with exactly this name.
    pub fn named(name: &str) -> Self {
        kubectl_ok(&["create", "namespace", name], None);
        TestNamespace {
            name: name.to_string(),
        }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let _ = kubectl(&["delete", "namespace", &self.name, "--wait=false"], None);
    }
}

/// Polls `probe` every 250 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs an instant PromQL query against the harness's Prometheus and returns `data.result`.
pub async fn prometheus_query(query: &str) -> Vec<serde_json::Value> {
    let base = std::env::var("MF_PROMETHEUS_URL").expect("MF_PROMETHEUS_URL (from e2e/cluster env)");
    let resp: serde_json::Value = http()
        .get(format!("{base}/api/v1/query"))
        .query(&[("query", query)])
        .send()
        .await
        .expect("Prometheus reachable")
        .json()
        .await
        .expect("Prometheus JSON");
    assert_eq!(resp["status"], "success", "query {query} failed: {resp}");
    resp["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The fleet gateway's address on loopback (from `e2e/cluster env`).
pub fn gateway_url() -> String {
    std::env::var("MF_GATEWAY_URL").expect("MF_GATEWAY_URL (from e2e/cluster env)")
}

/// Chart values that run the gateway as the local cluster needs it: one replica, its metrics port and
/// its Service's ClusterIP as `e2e/cluster env` names them (the cluster's forwards dial that address).
pub fn gateway_values() -> Vec<String> {
    let metrics = std::env::var("MF_GATEWAY_METRICS_PORT").unwrap_or_else(|_| "8081".into());
    let ip = std::env::var("MF_GATEWAY_CLUSTER_IP").expect("MF_GATEWAY_CLUSTER_IP (from e2e/cluster env)");
    [
        "gateway.replicas=1".to_string(),
        format!("gateway.metricsPort={metrics}"),
        format!("gateway.service.clusterIP={ip}"),
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v])
    .collect()
}

/// Chart values that choose the images: the ones `make images push` pushed to the cluster's registry,
/// pinned by digest (dist/helm-values.yaml, written by e2e/scripts/push-images.sh).
pub fn image_values() -> Vec<String> {
    let values = repo_root().join("dist/helm-values.yaml");
    assert!(
        values.exists(),
        "{} is missing: push the images first (e2e/scripts/push-images.sh)",
        values.display()
    );
    vec!["-f".into(), values.display().to_string()]
}

/// Chart values for the node's directories the runtime pods read: the digest-keyed model cache (owned
/// by the runtime's user, as a node's admin would make it) and the scenarios' artifacts.
pub fn node_dir_values() -> Vec<String> {
    let cache = cluster_dir().join("model-cache");
    let artifacts = cluster_dir().join("artifacts");
    for d in [&cache, &artifacts] {
        std::fs::create_dir_all(d).unwrap();
    }
    // The runtime runs as 65532 (the chart's runAsUser): the cache must be its to write.
    std::os::unix::fs::chown(&cache, Some(65532), Some(65532)).unwrap();
    [
        format!("modelCache.hostPath={}", cache.display()),
        // The delivery scenario's scale-out reads ModelPack artifacts through the node cache.
        "modelCache.namespaces[0]=e2e-cache-*".to_string(),
        // `file://` models and adapters come from the scenarios' artifacts, mounted read-only, in the
        // scenarios' namespaces only: elsewhere the restricted standard can be enforced (node.rs).
        format!("runtime.nodeFileRoots[0]={}", artifacts.display()),
        "runtime.nodeFileNamespaces[0]=e2e-*".to_string(),
        format!("runtime.adapterFileRoots[0]={}", artifacts.display()),
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v])
    .collect()
}

/// The fleet gateway's `/metrics` page, from its metrics port on loopback.
pub async fn gateway_metrics() -> String {
    let port = std::env::var("MF_GATEWAY_METRICS_PORT").unwrap_or_else(|_| "8081".into());
    http()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .expect("gateway metrics")
        .text()
        .await
        .unwrap()
}

/// The cluster's OCI registry on loopback (from `e2e/cluster env`).
pub fn registry() -> String {
    std::env::var("MF_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5000".into())
}

/// The taint key placement.rs puts on the node (effect NoSchedule) while its pool scenario runs.
pub const PLACEMENT_TAINT: &str = "modelfleet.io/e2e-placement";

/// The namespace the chart installs the operator into.
pub const OPERATOR_NS: &str = "modelfleet-system";

static INSTALL: Mutex<bool> = Mutex::new(false);

pub fn cluster_dir() -> PathBuf {
    PathBuf::from(std::env::var("MF_CLUSTER_DIR").expect("MF_CLUSTER_DIR (from e2e/cluster env)"))
}

/// Applies the CRDs and installs (or upgrades) the chart once per test process, then waits for a
/// leader.
pub async fn ensure_operator() {
    {
        let mut done = INSTALL.lock().unwrap();
        if !*done {
            kubectl_ok(
                &[
                    "apply",
                    "--server-side",
                    "-f",
                    repo_root().join("crds").to_str().unwrap(),
                ],
                None,
            );
            // Every scenario's operator, gateway and runtime pods export their traces to the suite's
            // Jaeger (traces.rs reads them); it may still be starting: spans are dropped until then.
            tracing::deploy_jaeger();
            let chart = repo_root().join("charts/modelfleet");
            // Scenario binaries run side by side (scripts/run-e2e.sh): one helm operation on the
            // release at a time, or the second fails with "another operation is in progress".
            let lock = cluster_dir().join("helm.lock");
            let out = std::process::Command::new("flock")
                .args([lock.to_str().unwrap(), "helm"])
                .args(["upgrade", "--install", "modelfleet", chart.to_str().unwrap()])
                .args([
                    "--namespace",
                    OPERATOR_NS,
                    "--create-namespace",
                    "--wait",
                    "--timeout",
                    "90s",
                ])
                .args(image_values())
                .args(node_dir_values())
                // The fleet gateway: one replica, at MF_GATEWAY_URL.
                .args(gateway_values())
                .args([
                    "--set",
                    &format!("tracing.otlpEndpoint={}", tracing::otlp_endpoint()),
                ])
                // The operator serves external.metrics.k8s.io (placement.rs drives an HPA with it).
                .args(["--set", "externalMetrics.enabled=true"])
                .output()
                .expect("flock and helm on PATH (eval \"$(e2e/cluster env)\")");
            assert!(
                out.status.success(),
                "helm install failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            // A placement scenario killed mid-run leaves its taint on the one node: nothing would
            // schedule. It removes the taint itself on every other path.
            let _ = kubectl(&["taint", "nodes", "--all", &format!("{PLACEMENT_TAINT}-")], None);
            *done = true;
        }
    }
    wait_until(
        "the fleet gateway to be ready",
        Duration::from_secs(60),
        || async {
            let r = http().get(format!("{}/ready", gateway_url())).send().await.ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(client().await, OPERATOR_NS);
    wait_until(
        "an operator replica to hold the leader lease",
        Duration::from_secs(60),
        || async {
            let lease = leases.get("modelfleet-operator").await.ok()?;
            lease.spec?.holder_identity.filter(|h| !h.is_empty())
        },
    )
    .await;
}

/// Runs `e2e/cluster ARGS` against this test's cluster and panics unless it succeeds.
pub fn cluster_script(args: &[&str]) {
    let out = Command::new(repo_root().join("e2e/cluster"))
        .args(args)
        .env("MODELFLEET_CLUSTER_DIR", cluster_dir())
        .output()
        .expect("e2e/cluster runs");
    assert!(
        out.status.success(),
        "e2e/cluster {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every PromQL query of the chart's Grafana dashboard `file` (at least `min` of them) returns data
/// from the e2e Prometheus.
pub async fn dashboard_queries_return_data(file: &str, min: usize) {
    let text = std::fs::read_to_string(repo_root().join("charts/modelfleet/dashboards").join(file)).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(o) => {
                if let Some(e) = o.get("expr").and_then(|e| e.as_str()) {
                    out.push(e.to_string());
                }
                o.values().for_each(|v| walk(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&dashboard, &mut exprs);
    assert!(exprs.len() >= min, "{exprs:?}");
    for e in &exprs {
        let e = e.clone();
        wait_until(
            &format!("data for the dashboard query {e}"),
            Duration::from_secs(60),
            || {
                let e = e.clone();
                async move { (!prometheus_query(&e).await.is_empty()).then_some(()) }
            },
        )
        .await;
    }
    eprintln!("all {} queries of {file} return data", exprs.len());
}

/// Whether a pod is Ready and not being deleted (the operator's and the gateway's reading).
pub fn is_ready(p: &k8s_openapi::api::core::v1::Pod) -> bool {
    modelfleet_crds::pods::is_ready(p)
}

/// Ready pods of a ModelDeployment: name → IP.
pub async fn ready_pods(
    pods: &Api<k8s_openapi::api::core::v1::Pod>,
    instance: &str,
) -> std::collections::BTreeMap<String, String> {
    let lp = kube::api::ListParams::default().labels(&format!("app.kubernetes.io/instance={instance}"));
    let Ok(list) = pods.list(&lp).await else {
        return Default::default();
    };
    list.items
        .iter()
        .filter(|p| is_ready(p))
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            Some((p.metadata.name.clone()?, ip))
        })
        .collect()
}

/// `ctr -n k8s.io ARGS` against the real node's containerd (`MF_CONTAINERD_ADDRESS` from `e2e/cluster
/// env`): its stdout, or a panic with its stderr.
pub fn ctr(args: &[&str]) -> String {
    let address = std::env::var("MF_CONTAINERD_ADDRESS").expect("MF_CONTAINERD_ADDRESS (e2e/cluster env)");
    let out = Command::new("ctr")
        .args(["--address", &address, "-n", "k8s.io"])
        .args(args)
        .output()
        .expect("ctr on PATH (e2e/cluster env)");
    assert!(
        out.status.success(),
        "ctr {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The host PID of a running container (`containerd://ID` or `ID`), from containerd's task list.
pub fn container_pid(container_id: &str) -> u32 {
    let id = container_id.trim_start_matches("containerd://");
    ctr(&["tasks", "ls"])
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next()? == id).then(|| f.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("container {id} has no running task"))
}

/// SIGKILLs a pod's running container, as a crash or the kernel's OOM killer would end it.
pub fn sigkill_container(pod: &k8s_openapi::api::core::v1::Pod, container: &str) {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container))
        .and_then(|c| c.container_id.clone())
        .unwrap_or_else(|| panic!("{container} has a container id"));
    ctr(&[
        "tasks",
        "kill",
        "--signal",
        "SIGKILL",
        id.trim_start_matches("containerd://"),
    ]);
}
