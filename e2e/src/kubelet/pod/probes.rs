//! Startup, liveness and readiness probes of one running container instance.
//!
//! One task per container instance: the startup probe runs first (the container is `started`
//! when it passes, or at once without one); then readiness and liveness run side by side. Probes
//! report only transitions (started, ready ↔ unready, liveness or startup failed), so a healthy
//! pod causes no status writes.
//!
//! Semantics follow Kubernetes: defaults period 10 s, timeout 1 s, success threshold 1, failure
//! threshold 3, initial delay 0; readiness starts unready; httpGet succeeds on 200–399 (redirects
//! not followed), tcpSocket on connect, exec on exit code 0. HTTPS and gRPC probes fail with a
//! message saying they are unsupported.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ExecAction, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::process::signal_group;
use crate::kubelet::images::{self, ImageEntry};
use crate::kubelet::rewrite::PathRewriter;

/// A transition reported by the probe task.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeUpdate {
    /// The startup probe passed (or there is none).
    Started,
    /// The startup probe failed `failureThreshold` times.
    StartupFailed(String),
    /// Readiness changed; the message says why it became unready.
    Ready(bool, Option<String>),
    /// The liveness probe failed `failureThreshold` times.
    LivenessFailed(String),
}

/// What probes of one container instance run against.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    /// The pod's IP (default host of httpGet and tcpSocket).
    pub pod_ip: String,
    /// Named container ports.
    pub ports: HashMap<String, u16>,
    /// The container's environment (exec probes).
    pub env: Vec<(String, String)>,
    /// The container's working directory (exec probes).
    pub cwd: PathBuf,
    /// The container's path rules (exec probes).
    pub rewriter: PathRewriter,
    /// The container's image entry (exec probes resolve their executable like the container).
    pub image: ImageEntry,
    /// The kubelet's `PATH`.
    pub path_env: String,
}

/// Probe settings with Kubernetes defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Settings {
    initial_delay: Duration,
    period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

impl Settings {
    fn of(p: &Probe) -> Self {
        let secs = |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
        Settings {
            initial_delay: secs(p.initial_delay_seconds, 0),
            period: secs(p.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(p.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// Runs the container's probes until the task is aborted; `report` gets each transition.
pub async fn run(container: Container, target: Arc<ProbeTarget>, report: impl Fn(ProbeUpdate) + Send + Sync) {
    if let Some(p) = &container.startup_probe {
        let s = Settings::of(p);
        tokio::time::sleep(s.initial_delay).await;
        let mut failures = 0;
        loop {
            match execute(p, &target, s.timeout).await {
                Ok(()) => break,
                Err(msg) => {
                    failures += 1;
                    if failures >= s.failure_threshold {
                        report(ProbeUpdate::StartupFailed(format!("Startup probe failed: {msg}")));
                        return;
                    }
                }
            }
            tokio::time::sleep(s.period).await;
        }
    }
    report(ProbeUpdate::Started);
    let readiness = async {
        let Some(p) = &container.readiness_probe else {
            report(ProbeUpdate::Ready(true, None));
            return;
        };
        let s = Settings::of(p);
        tokio::time::sleep(s.initial_delay).await;
        let (mut ready, mut successes, mut failures) = (false, 0, 0);
        loop {
            match execute(p, &target, s.timeout).await {
                Ok(()) => {
                    (successes, failures) = (successes + 1, 0);
                    if !ready && successes >= s.success_threshold {
                        ready = true;
                        report(ProbeUpdate::Ready(true, None));
                    }
                }
                Err(msg) => {
                    (successes, failures) = (0, failures + 1);
                    if ready && failures >= s.failure_threshold {
                        ready = false;
                        report(ProbeUpdate::Ready(
                            false,
                            Some(format!("Readiness probe failed: {msg}")),
                        ));
                    }
                }
            }
            tokio::time::sleep(s.period).await;
        }
    };
    let liveness = async {
        let Some(p) = &container.liveness_probe else {
            return;
        };
        let s = Settings::of(p);
        tokio::time::sleep(s.initial_delay).await;
        let mut failures = 0;
        loop {
            match execute(p, &target, s.timeout).await {
                Ok(()) => failures = 0,
                Err(msg) => {
                    failures += 1;
                    if failures >= s.failure_threshold {
                        report(ProbeUpdate::LivenessFailed(format!(
                            "Liveness probe failed: {msg}"
                        )));
                        return;
                    }
                }
            }
            tokio::time::sleep(s.period).await;
        }
    };
    tokio::join!(readiness, liveness);
}

/// Runs one probe once.
async fn execute(probe: &Probe, target: &ProbeTarget, timeout: Duration) -> Result<(), String> {
    let attempt = async {
        if let Some(h) = &probe.http_get {
            http_get(h, target).await
        } else if let Some(t) = &probe.tcp_socket {
            let host = t
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| target.pod_ip.clone());
            let port = port(&t.port, target)?;
            TcpStream::connect((host.as_str(), port))
                .await
                .map(drop)
                .map_err(|e| format!("dial tcp {host}:{port}: {e}"))
        } else if let Some(e) = &probe.exec {
            exec(e, target, timeout).await
        } else if probe.grpc.is_some() {
            Err("gRPC probes are not supported by the process kubelet".to_string())
        } else {
            Err("probe has no handler".to_string())
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!("probe timed out after {}s", timeout.as_secs())),
    }
}

fn port(port: &IntOrString, target: &ProbeTarget) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => match name.parse::<u16>() {
            Ok(n) => Ok(n),
            Err(_) => target
                .ports
                .get(name)
                .copied()
                .ok_or_else(|| format!("no container port named {name:?}")),
        },
    }
}

async fn http_get(h: &HTTPGetAction, target: &ProbeTarget) -> Result<(), String> {
    if h.scheme
        .as_deref()
        .is_some_and(|s| !s.eq_ignore_ascii_case("HTTP"))
    {
        return Err("HTTPS probes are not supported by the process kubelet".to_string());
    }
    let host = h
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| target.pod_ip.clone());
    let port = port(&h.port, target)?;
    let path = h
        .path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/".to_string());
    let url = format!("http://{host}:{port}{path}");
    let mut stream = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("Get {url:?}: {e}"))?;
    let headers = h.http_headers.clone().unwrap_or_default();
    let mut request = format!("GET {path} HTTP/1.1\r\n");
    if !headers.iter().any(|x| x.name.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {host}:{port}\r\n"));
    }
    if !headers.iter().any(|x| x.name.eq_ignore_ascii_case("user-agent")) {
        request.push_str("User-Agent: kube-probe/1.35\r\n");
    }
    for header in &headers {
        request.push_str(&format!("{}: {}\r\n", header.name, header.value));
    }
    request.push_str("Accept: */*\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("Get {url:?}: {e}"))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 8192 {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| format!("Get {url:?}: {e}"))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let code = line.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok());
    match code {
        Some(code) if (200..400).contains(&code) => Ok(()),
        Some(code) => Err(format!("HTTP probe failed with statuscode: {code}")),
        None => Err(format!("Get {url:?}: malformed HTTP response")),
    }
}

async fn exec(e: &ExecAction, target: &ProbeTarget, timeout: Duration) -> Result<(), String> {
    let command: Vec<String> = e
        .command
        .iter()
        .flatten()
        .map(|s| target.rewriter.rewrite(s))
        .collect();
    let program = images::resolve(
        "",
        &target.image,
        &command,
        &[],
        &target.path_env,
        &images::is_executable,
    )?;
    let mut child = tokio::process::Command::new(&program.path)
        .args(&program.args)
        .env_clear()
        .envs(target.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&target.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("exec {:?}: {e}", program.path))?;
    let pid = child.id();
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(format!("command {command:?} exited with {status}")),
        Ok(Err(e)) => Err(format!("command {command:?}: {e}")),
        Err(_) => {
            if let Some(pid) = pid {
                signal_group(pid, nix::sys::signal::Signal::SIGKILL);
            }
            Err(format!("command {command:?} timed out"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_like_kubernetes() {
        let s = Settings::of(&Probe::default());
        assert_eq!(
            s,
            Settings {
                initial_delay: Duration::ZERO,
                period: Duration::from_secs(10),
                timeout: Duration::from_secs(1),
                success_threshold: 1,
                failure_threshold: 3,
            }
        );
    }

    fn target() -> Arc<ProbeTarget> {
        Arc::new(ProbeTarget {
            pod_ip: "127.0.0.1".into(),
            ports: HashMap::from([("http".to_string(), 1)]),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: std::env::temp_dir(),
            rewriter: PathRewriter::default(),
            image: ImageEntry::default(),
            path_env: "/usr/bin:/bin".into(),
        })
    }

    #[tokio::test]
    async fn probes_against_a_local_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                let status = if req.starts_with("GET /ready ") {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let _ = s
                    .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let probe = |json: serde_json::Value| -> Probe { serde_json::from_value(json).unwrap() };
        let t = target();
        let timeout = Duration::from_secs(2);
        let ok = probe(serde_json::json!({"httpGet": {"path": "/ready", "port": port}}));
        assert_eq!(execute(&ok, &t, timeout).await, Ok(()));
        let bad = probe(serde_json::json!({"httpGet": {"path": "/nope", "port": port}}));
        assert_eq!(
            execute(&bad, &t, timeout).await,
            Err("HTTP probe failed with statuscode: 503".into())
        );
        let tcp = probe(serde_json::json!({"tcpSocket": {"port": port}}));
        assert_eq!(execute(&tcp, &t, timeout).await, Ok(()));
        let named = probe(serde_json::json!({"tcpSocket": {"port": "missing"}}));
        assert!(execute(&named, &t, timeout).await.is_err());
        let https = probe(serde_json::json!({"httpGet": {"port": port, "scheme": "HTTPS"}}));
        assert!(
            execute(&https, &t, timeout)
                .await
                .unwrap_err()
                .contains("not supported")
        );
        let yes = probe(serde_json::json!({"exec": {"command": ["sh", "-c", "exit 0"]}}));
        assert_eq!(execute(&yes, &t, timeout).await, Ok(()));
        let no = probe(serde_json::json!({"exec": {"command": ["sh", "-c", "exit 3"]}}));
        assert!(execute(&no, &t, timeout).await.is_err());
    }
}
