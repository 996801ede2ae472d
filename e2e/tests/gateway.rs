//! The fleet gateway on the local control plane, end to end, at `MF_GATEWAY_URL` (the chart's gateway,
//! one replica on the node's network): a deployment with `minReplicas: 0` rests at 0 replicas (Ready,
//! `ScaledToZero`), answers a request through the gateway (the request waits while the operator scales
//! 0 → 1 on the gateway's pending-request metric) and returns to 0 after its idle window; unique prompts
//! spread evenly over 3 replicas; steady load through the gateway loses nothing during a rollout
//! restart and a scale 3 → 1; an unknown key is refused before the body is sent, tenant B gets 404 for
//! tenant A's adapter and does not see it, and a key rotated in the Secret takes effect without
//! restarts. Run by `make e2e`; nothing is mocked.

mod common;
use common::fleet::*;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use modelfleet_crds::{LoraAdapter, ModelDeployment};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The scenarios share two CPU cores, the operator and the gateway: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The model ids `GET /v1/models` lists for `key`.
async fn models(key: Option<&str>) -> Option<Vec<String>> {
    let mut req = gateway(Duration::from_secs(5)).get(format!("{}/v1/models", gateway_url()));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    let v: Value = r.json().await.ok()?;
    Some(
        v["data"]
            .as_array()?
            .iter()
            .filter_map(|m| m["id"].as_str().map(String::from))
            .collect(),
    )
}

async fn wait_scaled_to_zero(mds: &Api<ModelDeployment>, pods: &Api<Pod>, name: &str, timeout: Duration) {
    wait_until("Ready=True/ScaledToZero with no pods", timeout, || async {
        let md = mds.get(name).await.ok()?;
        let desired = md.status.as_ref()?.desired_replicas;
        (desired == Some(0)
            && condition(&md, "Ready") == Some(("True".into(), "ScaledToZero".into()))
            && pod_count(pods, name).await == 0)
            .then_some(())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn scale_from_zero_through_the_gateway_and_back_to_zero() {
    let _serial = SERIAL.lock().await;
    ensure_operator().await;
    let ns = TestNamespace::new("gwzero");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = tiny_model(&ns.name);
    let served = format!("zero-{}", ns.name);
    let md = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: zero\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {served}\n  runtime:\n    threads: 1\n  \
         autoscaling:\n    mode: Builtin\n    minReplicas: 0\n    maxReplicas: 1\n    scaleToZeroAfterSeconds: 15\n    \
         scaleUpStabilizationSeconds: 0\n    scaleDownStabilizationSeconds: 5\n",
        dir.display()
    );
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&md));
    // Nothing asked for it yet: it rests at zero, and that is Ready.
    wait_scaled_to_zero(&mds, &pods, "zero", Duration::from_secs(60)).await;
    // The gateway knows the model (it lists it) though no pod exists.
    wait_until(
        "the gateway to list the model",
        Duration::from_secs(30),
        || async { models(None).await?.contains(&served).then_some(()) },
    )
    .await;

    // One request: it waits at the gateway while the operator scales 0 → 1, then is answered.
    let t0 = Instant::now();
    let (status, pod, body) = chat(&gateway(Duration::from_secs(180)), None, &served, "wake up", 4)
        .await
        .expect("the gateway answers");
    let cold = t0.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(
        pod.starts_with("zero-"),
        "x-modelfleet-pod names the pod: {pod:?}"
    );
    eprintln!("scale from zero: answered after {cold:?} (cold start through the gateway)");
    let md_now = mds.get("zero").await.unwrap();
    assert_eq!(md_now.status.unwrap().desired_replicas, Some(1));

    // Idle for scaleToZeroAfterSeconds (15 s): back to 0, Ready again.
    wait_scaled_to_zero(&mds, &pods, "zero", Duration::from_secs(90)).await;
    let md_now = mds.get("zero").await.unwrap();
    let reasons: Vec<String> = md_now
        .status
        .unwrap()
        .recent_decisions
        .iter()
        .map(|d| d.reason.clone())
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("scale from zero"))
            && reasons.iter().any(|r| r.contains("scale to zero")),
        "{reasons:?}"
    );
}

/// Seconds since the Unix epoch, to the millisecond: failures carry it, to find them in component logs.
fn unix_now() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{:.3}", t.as_secs_f64())
}

/// Keeps `workers` clients sending chat completions through the gateway until stopped; counts answers
/// per pod and keeps every failure.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(model: &str, workers: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures: Arc<Mutex<Vec<String>>> = Arc::default();
        let tasks = (0..workers)
            .map(|w| {
                let (stop, ok, failures, model) =
                    (stop.clone(), ok.clone(), failures.clone(), model.to_string());
                tokio::spawn(async move {
                    let http = gateway(Duration::from_secs(60));
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        match chat(&http, None, &model, &format!("client {w} turn {i}"), 8).await {
                            Ok((200, _, _)) => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok((s, pod, body)) => failures
                                .lock()
                                .unwrap()
                                .push(format!("{s} from {pod}: {body} (at {})", unix_now())),
                            Err(e) => failures.lock().unwrap().push(format!("{e} (at {})", unix_now())),
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failures,
            tasks,
        }
    }

    async fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        (
            self.ok.load(Ordering::Relaxed),
            self.failures.lock().unwrap().clone(),
        )
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn unique_prompts_spread_and_rollouts_and_scale_downs_lose_nothing() {
    let _serial = SERIAL.lock().await;
    ensure_operator().await;
    let ns = TestNamespace::new("gwroll");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = tiny_model(&ns.name);
    let served = format!("roll-{}", ns.name);
    let md = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: roll\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {served}\n  replicas: 3\n  runtime:\n    threads: 1\n  \
         autoscaling:\n    mode: Disabled\n",
        dir.display()
    );
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&md));
    wait_for_three_ready(&mds).await;
    // The gateway routes to all three.
    wait_until(
        "the gateway to route to 3 pods",
        Duration::from_secs(30),
        || async {
            let http = gateway(Duration::from_secs(30));
            let mut seen = std::collections::BTreeSet::new();
            for i in 0..24 {
                if let Ok((200, pod, _)) = chat(&http, None, &served, &format!("probe {i}"), 1).await {
                    seen.insert(pod);
                }
            }
            (seen.len() == 3).then_some(())
        },
    )
    .await;
    unique_prompts_spread(&served).await;

    // A pod SIGKILLed under load: requests on it get a 502 naming it (not retried: a poison request
    // looks the same), streams in flight end (with an error event) instead of hanging, and the pod
    // leaves the rotation within 2 s. A release-built tiny model can finish a 1,900-token stream
    // before the kill lands; such a round tested nothing of the cut streams, so it is done again
    // (three rounds at most).
    let mut cut = false;
    for round in 1..=3 {
        cut = pod_killed_under_load(&served, &pods).await;
        wait_for_three_ready(&mds).await;
        if cut {
            break;
        }
        eprintln!("SIGKILL round {round}: every stream on the pod had finished before the kill; again");
    }
    assert!(
        cut,
        "in one of three rounds a stream was in flight on the killed pod (else nothing was tested)"
    );

    rollout_and_scale_down_under_load(&ns.name, &served, &mds, &pods).await;
    // The gateway's dashboard has data for this deployment (a pod still serving it).
    dashboard_queries_return_data("modelfleet-gateway.json", 7).await;
}

/// Waits until the deployment `roll` is Ready with 3 ready replicas.
async fn wait_for_three_ready(mds: &Api<ModelDeployment>) {
    wait_until("Ready with 3 replicas", Duration::from_secs(180), || async {
        let md = mds.get("roll").await.ok()?;
        let ready = md.status.as_ref()?.ready_replicas;
        (condition(&md, "Ready")?.0 == "True" && ready == 3).then_some(())
    })
    .await;
}

/// Balance: 768 unique prompts, 3 at a time — below the load floor (4), so no request overflows and
/// the spread is the ring's own: with 1,024 points per pod, 1.5× between the busiest and the least busy
/// pod is a >5σ event, and keys that collapsed onto one pod would put every prompt there. (At 16 at a
/// time the bounded loads act, and on a shared CPU a pod that runs faster rightly takes more: 318
/// against 223 was seen.)
async fn unique_prompts_spread(served: &str) {
    let served_by: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let (served_by, next, model) = (served_by.clone(), next.clone(), served.to_string());
            tokio::spawn(async move {
                let http = gateway(Duration::from_secs(60));
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= 768 {
                        return;
                    }
                    let prompt = format!("unique prompt number {i}: tell me about {}", i * 7919);
                    let (status, pod, body) = chat(&http, None, &model, &prompt, 2).await.expect("answered");
                    assert_eq!(status, 200, "{body}");
                    *served_by.lock().unwrap().entry(pod).or_default() += 1;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let counts = served_by.lock().unwrap().clone();
    eprintln!("unique prompts per pod: {counts:?}");
    assert_eq!(counts.len(), 3, "every pod served: {counts:?}");
    let (max, min) = (*counts.values().max().unwrap(), *counts.values().min().unwrap());
    assert!(
        max as f64 <= 1.5 * min as f64,
        "busiest {max} ≤ 1.5 × least busy {min}: {counts:?}"
    );
}

/// A rollout restart, then a scale from 3 to 1, under the steady load of 8 clients: nothing is lost.
async fn rollout_and_scale_down_under_load(
    ns: &str,
    served: &str,
    mds: &Api<ModelDeployment>,
    pods: &Api<Pod>,
) {
    let deployments: Api<Deployment> = Api::namespaced(client().await, ns);
    let load = Load::start(served, 8);
    tokio::time::sleep(Duration::from_secs(3)).await;
    kubectl_ok(&["rollout", "restart", "-n", ns, "deployment/roll"], None);
    kubectl_ok(
        &["rollout", "status", "-n", ns, "deployment/roll", "--timeout=240s"],
        None,
    );
    wait_until("the old pods to be gone", Duration::from_secs(120), || async {
        (pod_count(pods, "roll").await == 3).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    mds.patch(
        "roll",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .unwrap();
    wait_until("one pod left", Duration::from_secs(120), || async {
        let d = deployments.get("roll").await.ok()?;
        (d.spec?.replicas == Some(1) && pod_count(pods, "roll").await == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (ok, failures) = load.stop().await;
    eprintln!(
        "rollout + scale-down under load: {ok} answered, {} failed: {failures:?}",
        failures.len()
    );
    assert!(ok > 20, "the load ran: {ok} answers");
    // Every request is answered: the early closes once seen here (about one request in 25,000, then
    // one in 227,000) were the listener's idle and drain races, fixed on 2026-12-05 (e2e/README.md,
    // "Fixed: early closes during rollouts"); none in 25 runs and 575,472 requests since.
    assert!(failures.is_empty(), "no client request failed: {failures:?}");
}

const KEY_A: &str = "sk-gw-team-a";
const KEY_A2: &str = "sk-gw-team-a-rotated";
const KEY_B: &str = "sk-gw-team-b";

fn tenants_secret(ns: &str, key_a: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: gw-keys\n  namespace: {ns}\nstringData:\n  tenants.yaml: |\n    \
         tenants:\n    - id: team-a\n      apiKeys: [\"{key_a}\"]\n    - id: team-b\n      apiKeys: [\"{KEY_B}\"]\n"
    )
}

/// Sends a request head announcing a 1 MB body and no body: the status line of the answer, or `None`
/// when none came within 5 s (the gateway waits for a body while any keyless deployment is in its
/// scope — its view of one being deleted may lag the API's — so the caller retries).
async fn status_without_body(key: &str) -> Option<String> {
    let addr = gateway_url().trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("gateway reachable");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
    )
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn keys_are_checked_at_the_edge_adapters_are_hidden_and_rotation_needs_no_restart() {
    let _serial = SERIAL.lock().await;
    ensure_operator().await;
    let ns = TestNamespace::new("gwauth");
    let client = client().await;
    let all_mds: Api<ModelDeployment> = Api::all(client.clone());
    let adapters: Api<LoraAdapter> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = tiny_model(&ns.name);
    let adapter_dir = cluster_dir().join("artifacts").join(&ns.name).join("sql");
    let _ = std::fs::remove_dir_all(&adapter_dir);
    runtime(&[
        "gen-adapter",
        adapter_dir.to_str().unwrap(),
        "--base",
        dir.to_str().unwrap(),
        "--rank",
        "8",
        "--seed",
        "1",
    ]);
    let adapter_digest = runtime(&["digest", adapter_dir.to_str().unwrap()])
        .trim()
        .to_string();
    let base = format!("auth-{}", ns.name);
    let sql = format!("sql-{}", ns.name);
    let manifests = format!(
        "{}---\napiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: auth\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {base}\n  replicas: 1\n  runtime:\n    threads: 1\n  \
         autoscaling:\n    mode: Disabled\n  tenants:\n    secretRef:\n      name: gw-keys\n---\n\
         apiVersion: modelfleet.io/v1alpha1\nkind: LoraAdapter\nmetadata:\n  name: sql\nspec:\n  modelDeploymentRef:\n    \
         name: auth\n  servedName: {sql}\n  uri: file://{}\n  digest: \"{adapter_digest}\"\n  tenants: [team-a]\n",
        tenants_secret(&ns.name, KEY_A),
        dir.display(),
        adapter_dir.display()
    );
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&manifests));
    wait_until("the adapter Ready", Duration::from_secs(180), || async {
        let a = adapters.get("sql").await.ok()?;
        let c = a.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
        (c.status == "True").then_some(())
    })
    .await;
    wait_until(
        "the gateway to list the adapter to team-a",
        Duration::from_secs(30),
        || async { models(Some(KEY_A)).await?.contains(&sql).then_some(()) },
    )
    .await;

    // Team A uses its adapter; team B gets the 404 of a model that does not exist, and no listing.
    let http = gateway(Duration::from_secs(60));
    let (s, _, body) = chat(&http, Some(KEY_A), &sql, "select", 4).await.unwrap();
    assert_eq!(s, 200, "{body}");
    let (s, _, hidden) = chat(&http, Some(KEY_B), &sql, "select", 4).await.unwrap();
    let (s2, _, missing) = chat(&http, Some(KEY_B), "no-such-model-anywhere", "x", 4)
        .await
        .unwrap();
    assert_eq!((s, s2), (404, 404), "{hidden} / {missing}");
    assert_eq!(
        hidden["error"]["code"], missing["error"]["code"],
        "{hidden} / {missing}"
    );
    let listed_b = models(Some(KEY_B)).await.unwrap();
    assert!(
        listed_b.contains(&base) && !listed_b.contains(&sql),
        "{listed_b:?}"
    );
    let (s, _, body) = chat(&http, Some(KEY_B), &base, "hello", 4).await.unwrap();
    assert_eq!(s, 200, "{body}");

    // An unknown key: 401 before the body is read — once no keyless deployment is in the gateway's
    // scope (earlier scenarios' namespaces may still be going away).
    wait_until(
        "no keyless ModelDeployment in the cluster",
        Duration::from_secs(180),
        || async {
            let list = all_mds.list(&ListParams::default()).await.ok()?;
            list.items.iter().all(|m| m.spec.tenants.is_some()).then_some(())
        },
    )
    .await;
    let line = wait_until(
        "401 for an unknown key without a body",
        Duration::from_secs(60),
        || async {
            let line = status_without_body("sk-nobody").await?;
            line.contains(" 401 ").then_some(line)
        },
    )
    .await;
    eprintln!("unknown key, no body sent: {line}");
    // A known key with the same missing body is not refused at once (the gateway waits for it).
    let addr = gateway_url().trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY_B}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf))
            .await
            .is_err(),
        "a known key's request waits for its body"
    );
    drop(s);

    // Rotate team A's key in the Secret: the new one works and the old one is refused, no restart.
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&tenants_secret(&ns.name, KEY_A2)),
    );
    // The gateway reads the Secret within seconds; the pods see it when the kubelet updates their
    // mounted copy (its sync period plus its cache's TTL: e2e/README.md, docs/gateway.md).
    wait_until(
        "the rotated key to work at the gateway",
        Duration::from_secs(120),
        || async {
            let (s, _, _) = chat(&http, Some(KEY_A2), &sql, "select", 2).await.ok()?;
            (s == 200).then_some(())
        },
    )
    .await;
    let (s, _, body) = chat(&http, Some(KEY_A), &base, "hello", 2).await.unwrap();
    assert_eq!(s, 401, "the old key is refused: {body}");
}

/// A streamed chat completion of many tokens: the pod serving it, and the response to read on.
async fn long_stream(model: &str, i: usize) -> (String, reqwest::Response) {
    let r = gateway(Duration::from_secs(120))
        .post(format!("{}/v1/chat/completions", gateway_url()))
        .json(
            // ~2 KB per event: the pod outruns this test's reader, so its socket fills and the
            // stream stays in flight on the pod until read.
            &json!({"model": model, "stream": true, "max_tokens": 1900, "ignore_eos": true,
            "logprobs": true, "top_logprobs": 20,
            "messages": [{"role": "user", "content": format!("stream {i}: a long story {}", i * 104729)}]}),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("stream {i}: {}", error_chain(&e)));
    assert_eq!(r.status(), 200, "stream {i}");
    (served_by(&r), r)
}

/// How a stream ended.
struct Ended {
    /// With `data: [DONE]`.
    done: bool,
    /// The pod finished it (a `finish_reason` came).
    finished: bool,
    /// An error event came.
    error: bool,
}

/// Reads a stream to its end.
async fn drain_stream(mut r: reqwest::Response) -> Ended {
    let mut text = String::new();
    while let Ok(Some(chunk)) = r.chunk().await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    Ended {
        done: text.contains("data: [DONE]"),
        finished: text.contains("\"finish_reason\":\"length\""),
        error: text.contains("\"error\""),
    }
}

/// `modelfleet_gateway_retries_total` summed, from the gateway's metrics port.
async fn gateway_retries() -> f64 {
    gateway_metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("modelfleet_gateway_retries_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// SIGKILLs the runtime container of the pod serving the last of six long streams, under the load of
/// 8 clients, and checks what every request and stream saw. True if a stream was in flight on the pod
/// at the kill (cut by it).
async fn pod_killed_under_load(served: &str, pods: &Api<Pod>) -> bool {
    let load = Load::start(served, 8);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut streams = Vec::new();
    for i in 0..6 {
        streams.push(long_stream(served, i).await);
    }
    // The last stream opened has the most tokens still to come.
    let victim_name = streams[5].0.clone();
    let victim = pods.get(&victim_name).await.unwrap();
    let on_victim = streams.iter().filter(|(p, _)| *p == victim_name).count();
    let readers: Vec<_> = streams
        .into_iter()
        .map(|(pod, r)| tokio::spawn(async move { (pod, drain_stream(r).await) }))
        .collect();
    sigkill_container(&victim, "runtime");
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let retries_at_2s = gateway_retries().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let retries_later = gateway_retries().await;
    let (ok, failures) = load.stop().await;
    let (mut ended_with_error, mut in_flight) = (0, 0);
    for r in readers {
        let (pod, e) = tokio::time::timeout(Duration::from_secs(120), r)
            .await
            .expect("every stream ends (none hangs)")
            .unwrap();
        assert!(e.done, "stream on {pod} ended with [DONE]");
        if e.finished {
            assert!(
                !e.error,
                "the stream on {pod} was finished by its pod, without an error"
            );
        } else {
            assert_eq!(pod, victim_name, "only streams on the killed pod were cut");
            in_flight += 1;
            assert!(
                e.error,
                "the stream cut on the killed pod {pod} ended with an error event"
            );
            ended_with_error += 1;
        }
    }
    eprintln!(
        "SIGKILL of {victim_name} under load: {ok} answered, {} failed (lost with the pod, not retried); \
         {ended_with_error}/{on_victim} streams on it ended with an error event ({in_flight} in flight at the kill); \
         gateway retries {retries_at_2s} at +2 s, {retries_later} at {:?}",
        failures.len(),
        killed.elapsed()
    );
    // A request on the killed pod before its first byte is not retried: its broken connection looks
    // exactly like a poison request's (docs/gateway.md). It gets a 502 naming the pod; every other
    // request succeeded.
    let (lost_with_victim, other): (Vec<_>, Vec<_>) = failures
        .iter()
        .partition(|f| f.starts_with("502") && f.contains("went away") && f.contains(victim_name.as_str()));
    assert!(other.is_empty(), "no other request failed: {other:?}");
    assert!(
        lost_with_victim.len() <= 8,
        "at most the 8 clients' requests in flight on the killed pod: {lost_with_victim:?}"
    );
    assert_eq!(
        retries_at_2s, retries_later,
        "no request was sent to the killed pod later than 2 s after the kill"
    );
    in_flight > 0
}
