//! Helpers of the scenarios that run models through the fleet gateway: a generated tiny model and its
//! digest, a gateway client, a chat completion that reports the pod that served it, conditions and
//! pod counts.

use super::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use modelfleet_crds::ModelDeployment;
use serde_json::{Value, json};

/// The workspace's debug `modelfleet-runtime`, or `$MF_RUNTIME_BIN` (the benchmarks use the release
/// binary in dist/ to generate and package models of real size).
pub fn runtime_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("MF_RUNTIME_BIN") {
        return PathBuf::from(bin);
    }
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or(repo_root().join("target"))
        .join("debug/modelfleet-runtime")
}

/// Runs `modelfleet-runtime ARGS` and returns its stdout.
pub fn runtime(args: &[&str]) -> String {
    let out = std::process::Command::new(runtime_bin())
        .args(args)
        .output()
        .expect("modelfleet-runtime built");
    assert!(
        out.status.success(),
        "modelfleet-runtime {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A generated tiny model under the cluster's artifacts directory, and its digest.
pub fn tiny_model(ns: &str) -> (PathBuf, String) {
    let dir = cluster_dir().join("artifacts").join(ns).join("model");
    let _ = std::fs::remove_dir_all(&dir);
    runtime(&[
        "gen-model",
        dir.to_str().unwrap(),
        "--shape",
        "tiny",
        "--seed",
        "11",
    ]);
    let d = runtime(&["digest", dir.to_str().unwrap()]).trim().to_string();
    (dir, d)
}

/// A gateway client: requests wait up to `timeout` (a cold start takes a while). Idle connections are
/// dropped after 5 s, well within the gateway's `--idle-timeout` (120 s): a client that reuses a
/// connection as the server closes it sees "connection closed before message completed" (a race every
/// HTTP/1.1 client has; docs/operations.md).
pub fn gateway(timeout: Duration) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(timeout)
        .pool_idle_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// A chat completion through the gateway: the status, the pod that served, and the body.
pub async fn chat(
    http: &reqwest::Client,
    key: Option<&str>,
    model: &str,
    prompt: &str,
    max_tokens: u32,
) -> Result<(u16, String, Value), String> {
    let mut req = http.post(format!("{}/v1/chat/completions", gateway_url())).json(
        &json!({"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0}),
    );
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.map_err(|e| error_chain(&e))?;
    let (status, pod) = (r.status().as_u16(), served_by(&r));
    let body = r.json().await.map_err(|e| error_chain(&e))?;
    Ok((status, pod, body))
}

/// The pod that served an answer (the gateway's `x-modelfleet-pod`; empty if none).
pub fn served_by(r: &reqwest::Response) -> String {
    r.headers()
        .get("x-modelfleet-pod")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// An error and its sources, so a failure says why (reset, refused, closed early…).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

pub fn condition(md: &ModelDeployment, type_: &str) -> Option<(String, String)> {
    let c = md.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone()))
}

/// Pods of a ModelDeployment that exist (terminating ones included).
pub async fn pod_count(pods: &Api<Pod>, instance: &str) -> usize {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={instance}"));
    pods.list(&lp).await.map(|l| l.items.len()).unwrap_or(usize::MAX)
}
