//! `spec.fallback` through the fleet gateway on the local cluster (the chart's gateway at
//! `MF_GATEWAY_URL`, the operator's autoscaler, the real runtime), in one namespace, one after another:
//! 1. a deployment resting at zero replicas hands its requests to its fallback deployment at once
//!    (`noReadyReplicaWaitSeconds: 0`) — each answer naming the deployment that gave it
//!    (`x-modelfleet-served-by`) — and those moves alone are demand enough for the operator to scale
//!    it from zero; once its own pod is Ready it answers them itself;
//! 2. a stream that sent its first token is never moved, even when its pod's process is killed
//!    (SIGKILL through the node's containerd) right after: it ends with an error event;
//! 3. a slowed revision (`--fault-delay-ms 3000`) with a 1 s first-token deadline: every answer comes
//!    from the fallback, once, about a second after it was asked;
//! 4. (alongside, in its own namespace) an external provider — another runtime reached at its
//!    Service's ClusterIP with its own key — answers what a saturated deployment refuses, and the
//!    usage is recorded as `provider:ext` at the provider's prices.
//!
//! (The gateway tests cover the wait and the deadline's edges.) Run by `make e2e`.

mod common;
use common::fleet::*;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use modelfleet_crds::ModelDeployment;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A chat completion naming `model` through the gateway: status, `x-modelfleet-served-by`, body.
async fn ask(http: &reqwest::Client, model: &str, prompt: &str) -> (u16, String, Value) {
    let r = http
        .post(format!("{}/v1/chat/completions", gateway_url()))
        .json(
            &json!({"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 4, "temperature": 0}),
        )
        .send()
        .await
        .expect("the gateway answers");
    let status = r.status().as_u16();
    let served_by = r
        .headers()
        .get("x-modelfleet-served-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (status, served_by, r.json().await.unwrap_or(Value::Null))
}

/// Whether the gateway lists `model` (it learns deployments from its watch).
async fn listed(model: &str) -> bool {
    let Ok(r) = gateway(Duration::from_secs(5))
        .get(format!("{}/v1/models", gateway_url()))
        .send()
        .await
    else {
        return false;
    };
    let v: Value = r.json().await.unwrap_or(Value::Null);
    v["data"]
        .as_array()
        .is_some_and(|d| d.iter().any(|m| m["id"] == model))
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn fallbacks_from_zero_at_the_first_token_deadline_and_never_mid_stream() {
    ensure_operator().await;
    let ns = TestNamespace::new("fallback");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = tiny_model(&ns.name);
    let (big, small) = (format!("big-{}", ns.name), format!("small-{}", ns.name));
    let md = |name: &str, served: &str, rest: &str| {
        format!(
            "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: {name}\nspec:\n  \
             model:\n    uri: file://{}\n    digest: \"{digest}\"\n    servedName: {served}\n  runtime:\n    \
             threads: 1\n{rest}",
            dir.display()
        )
    };
    let apply = ["apply", "-n", ns.name.as_str(), "-f", "-"];
    kubectl_ok(
        &apply,
        Some(&md(
            "small",
            &small,
            "  replicas: 1\n  autoscaling:\n    mode: Disabled\n",
        )),
    );
    kubectl_ok(
        &apply,
        Some(&md(
            "big",
            &big,
            "  autoscaling:\n    mode: Builtin\n    minReplicas: 0\n    maxReplicas: 1\n    \
             scaleToZeroAfterSeconds: 600\n    scaleUpStabilizationSeconds: 0\n  fallback:\n    \
             noReadyReplicaWaitSeconds: 0\n    targets:\n    - modelDeployment: small\n      triggers: [NoReadyReplica]\n",
        )),
    );
    wait_until(
        "big at zero, small Ready, both listed",
        Duration::from_secs(120),
        || async {
            let at_zero = mds.get("big").await.ok()?.status?.desired_replicas == Some(0)
                && pod_count(&pods, "big").await == 0;
            let small_ready = ready_pods(&pods, "small").await.len() == 1;
            (at_zero && small_ready && listed(&big).await && listed(&small).await).then_some(())
        },
    )
    .await;

    // No wait at all (`noReadyReplicaWaitSeconds: 0`): small answers at once, and big's pending gauge
    // never shows the request — the moves alone must wake it.
    let http = gateway(Duration::from_secs(60));
    let began = Instant::now();
    let (status, served_by, body) = ask(&http, &big, "first").await;
    let first = began.elapsed();
    eprintln!("fallback: the first request answered by {served_by} after {first:?}");
    assert_eq!(status, 200, "{body}");
    assert_eq!(served_by, format!("{}/small", ns.name));
    assert_eq!(body["model"], small.as_str(), "small's own answer");
    assert!(
        first < Duration::from_secs(4),
        "moved at once, not after the 180 s pending limit: {first:?}"
    );

    // Those moves are demand: big scales from zero, and answers for itself once Ready.
    let from_small = AtomicUsize::new(1);
    let woke = Instant::now();
    let (own, theirs) = (format!("{}/big", ns.name), format!("{}/small", ns.name));
    wait_until(
        "big answers its own requests",
        Duration::from_secs(180),
        || async {
            let (status, served_by, body) = ask(&http, &big, "again").await;
            assert_eq!(
                status, 200,
                "every request is answered while big scales up: {body}"
            );
            if served_by == own {
                return Some(());
            }
            assert_eq!(served_by, theirs);
            from_small.fetch_add(1, Ordering::Relaxed);
            None
        },
    )
    .await;
    eprintln!(
        "fallback: {} requests answered by small; big answered for itself {:?} after the first",
        from_small.load(Ordering::Relaxed),
        woke.elapsed()
    );
    let status = mds.get("big").await.unwrap().status.unwrap();
    assert_eq!(status.desired_replicas, Some(1));
    assert!(
        status
            .recent_decisions
            .iter()
            .any(|d| d.reason.contains("moved to a fallback")),
        "scaled from zero on the moves: {:?}",
        status.recent_decisions
    );
    // Big's own pod now takes its requests at once.
    let began = Instant::now();
    let (status, served_by, _) = ask(&http, &big, "now").await;
    assert_eq!((status, served_by.as_str()), (200, own.as_str()));
    eprintln!("fallback: big answered directly in {:?}", began.elapsed());

    a_started_stream_never_moves(&pods, &big, &own, &ns.name).await;
    let slow = md(
        "big",
        &big,
        "    extraArgs: [\"--enable-fault-injection\", \"--fault-delay-ms\", \"3000\"]\n  replicas: 1\n  \
         autoscaling:\n    mode: Disabled\n  fallback:\n    firstTokenDeadlineMilliseconds: 1000\n    targets:\n    \
         - modelDeployment: small\n      triggers: [FirstTokenDeadline]\n",
    );
    kubectl_ok(&apply, Some(&slow));
    a_slow_revision_hands_its_requests_over_at_the_deadline(&pods, &big, &small, &ns.name).await;
}

/// A stream through the gateway (8 choices of 1,900 tokens: seconds of work, so the kill lands
/// mid-stream): its first chunk arrives from `own`; then the pod's process is killed, and the stream
/// ends with an error event — nothing moves to the fallback.
async fn a_started_stream_never_moves(pods: &Api<Pod>, big: &str, own: &str, ns: &str) {
    let moved_before = moved(ns, "").await;
    let http = gateway(Duration::from_secs(60));
    let mut r = http
        .post(format!("{}/v1/chat/completions", gateway_url()))
        .json(
            &json!({"model": big, "messages": [{"role": "user", "content": "a long one"}],
            "max_tokens": 1900, "n": 8, "ignore_eos": true, "temperature": 0, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let served_by = r.headers()["x-modelfleet-served-by"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(served_by, own);
    let first = r.chunk().await.unwrap().expect("a first chunk");
    assert!(String::from_utf8_lossy(&first).starts_with("data: "), "{first:?}");
    // Kill the pod's runtime process now (what an OOM kill or a crash does).
    let pod = pods
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/instance=big"))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(is_ready)
        .expect("big's Ready pod");
    let container = pod.status.unwrap().container_statuses.unwrap()[0]
        .container_id
        .clone()
        .unwrap();
    let id = container.trim_start_matches("containerd://");
    ctr(&["tasks", "kill", "--signal", "SIGKILL", id]);
    let mut rest = String::from_utf8_lossy(&first).to_string();
    while let Ok(Some(c)) = r.chunk().await {
        rest.push_str(&String::from_utf8_lossy(&c));
    }
    let tail: String = rest
        .chars()
        .rev()
        .take(400)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    assert!(
        rest.contains("\"error\"") && rest.trim_end().ends_with("data: [DONE]"),
        "the cut stream ends with an error event and [DONE], not a replay: …{tail}"
    );
    assert!(
        !rest.contains("\"finish_reason\":\"length\""),
        "it was cut: …{tail}"
    );
    assert_eq!(
        moved(ns, "").await,
        moved_before,
        "nothing moved after the first byte"
    );
    eprintln!(
        "fallback: a stream killed after {} bytes ended with an error event; nothing moved",
        rest.len()
    );
}

/// Big's slowed revision (3 s before each request) with a 1 s first-token deadline: every request
/// is answered by small, once, a little after the second; big's pod gave each up (its 504
/// `first_token_deadline`), so none is answered twice.
async fn a_slow_revision_hands_its_requests_over_at_the_deadline(
    pods: &Api<Pod>,
    big: &str,
    small: &str,
    ns: &str,
) {
    wait_until(
        "big's slowed revision Ready, alone",
        Duration::from_secs(180),
        || async {
            let lp = kube::api::ListParams::default().labels("app.kubernetes.io/instance=big");
            let list = pods.list(&lp).await.ok()?.items;
            let slowed = |p: &Pod| {
                p.spec.as_ref().is_some_and(|s| {
                    s.containers[0]
                        .args
                        .as_ref()
                        .is_some_and(|a| a.iter().any(|x| x == "--fault-delay-ms"))
                })
            };
            let alone = list.len() == 1 && slowed(&list[0]) && is_ready(&list[0]);
            // The gateway knows it (and its new spec) once it routes to the new pod.
            (alone && listed(big).await).then_some(())
        },
    )
    .await;
    // The gateway learns the new fallback spec from its watch: wait until a request moves.
    let http = gateway(Duration::from_secs(60));
    let theirs = format!("{ns}/small");
    wait_until(
        "the gateway applies the deadline",
        Duration::from_secs(60),
        || async {
            let (status, served_by, _) = ask(&http, big, "warm").await;
            (status == 200 && served_by == theirs).then_some(())
        },
    )
    .await;
    let before = moved(ns, "first_token_deadline").await;
    let mut took = Vec::new();
    for (i, stream) in [false, true, false, true, false, true].into_iter().enumerate() {
        let began = Instant::now();
        let r = http
            .post(format!("{}/v1/chat/completions", gateway_url()))
            .json(
                &json!({"model": big, "messages": [{"role": "user", "content": format!("slow {i}")}],
                "max_tokens": 4, "temperature": 0, "stream": stream}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let served_by = r.headers()["x-modelfleet-served-by"]
            .to_str()
            .unwrap()
            .to_string();
        let body = r.text().await.unwrap();
        took.push(began.elapsed().as_secs_f64());
        assert_eq!(served_by, theirs, "{body}");
        // One answer, small's: a stream of small's chunks with one [DONE], or one JSON body.
        assert_eq!(
            body.matches(&format!("\"model\":\"{small}\"")).count().min(1),
            1,
            "{body}"
        );
        assert!(!body.contains(&format!("\"model\":\"{big}\"")), "{body}");
        if stream {
            assert_eq!(body.matches("data: [DONE]").count(), 1, "{body}");
        }
    }
    let after = moved(ns, "first_token_deadline").await;
    assert_eq!(after - before, 6.0, "each request moved exactly once");
    took.sort_by(f64::total_cmp);
    eprintln!(
        "fallback: 6 requests to the slowed revision answered by small in {:.2}–{:.2} s (deadline 1 s)",
        took[0], took[5]
    );
    assert!(
        took[0] >= 0.9 && took[5] < 3.0,
        "at the deadline, not after the 3 s hold: {took:?}"
    );
}

/// `modelfleet_gateway_fallbacks_total` moves from deployment `big` of `ns` (for `reason`, or any).
async fn moved(ns: &str, reason: &str) -> f64 {
    gateway_metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("modelfleet_gateway_fallbacks_total{"))
        .filter(|l| l.contains("model_deployment=\"big\"") && l.contains("result=\"moved\""))
        .filter(|l| l.contains(&format!("namespace=\"{ns}\"")))
        .filter(|l| reason.is_empty() || l.contains(&format!("reason=\"{reason}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// 4. An external provider: `ext`, another runtime behind its Service, called at its ClusterIP with
/// its own key (its tenants Secret knows only that key), takes the requests `busy` refuses for
/// saturation (one sequence at a time, at most 8 waiting: a request of 8 choices is refused while
/// another's choices wait); the answer is ext's, and the usage is recorded as `provider:ext` at the
/// provider's prices.
#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn a_provider_answers_when_the_fleet_is_saturated_and_is_priced_as_itself() {
    ensure_operator().await;
    let ns = TestNamespace::new("provider");
    let client = client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = tiny_model(&ns.name);
    let (busy, ext) = (format!("busy-{}", ns.name), format!("ext-{}", ns.name));
    let md = |name: &str, served: &str, rest: &str| {
        format!(
            "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: {name}\nspec:\n  \
             model:\n    uri: file://{}\n    digest: \"{digest}\"\n    servedName: {served}\n  replicas: 1\n  \
             autoscaling:\n    mode: Disabled\n  runtime:\n    threads: 1\n{rest}",
            dir.display()
        )
    };
    let apply = ["apply", "-n", ns.name.as_str(), "-f", "-"];
    let keys = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ext-tenants\nstringData:\n  tenants.yaml: |\n    \
                tenants:\n    - id: overflow\n      apiKeys: [sk-ext-provider-1]\n---\napiVersion: v1\nkind: Secret\n\
                metadata:\n  name: ext-key\nstringData:\n  apiKey: sk-ext-provider-1\n";
    kubectl_ok(&apply, Some(keys));
    kubectl_ok(
        &apply,
        Some(&md(
            "ext",
            &ext,
            "  tenants:\n    secretRef:\n      name: ext-tenants\n",
        )),
    );
    let ip = wait_until("ext's Service", Duration::from_secs(60), || async {
        let ip = kubectl(
            &[
                "get",
                "svc",
                "ext",
                "-n",
                &ns.name,
                "-o",
                "jsonpath={.spec.clusterIP}",
            ],
            None,
        );
        let ip = String::from_utf8_lossy(&ip.stdout).trim().to_string();
        (!ip.is_empty()).then_some(ip)
    })
    .await;
    let fallback = format!(
        "    maxNumSeqs: 1\n    extraArgs: [\"--max-num-queued-reqs\", \"8\"]\n  cost:\n    currency: EUR\n    \
         inputPerMillionTokens: \"1\"\n    outputPerMillionTokens: \"1\"\n  fallback:\n    targets:\n    - provider:\n        \
         name: ext\n        baseUrl: http://{ip}:8000/v1\n        model: {ext}\n        apiKeySecretRef: {{name: ext-key}}\n        \
         timeoutSeconds: 30\n        inputPerMillionTokens: \"3\"\n        outputPerMillionTokens: \"5\"\n      \
         triggers: [Saturated]\n"
    );
    kubectl_ok(&apply, Some(&md("busy", &busy, &fallback)));
    wait_until(
        "busy and ext Ready, busy listed",
        Duration::from_secs(180),
        || async {
            let ready =
                ready_pods(&pods, "busy").await.len() == 1 && ready_pods(&pods, "ext").await.len() == 1;
            (ready && listed(&busy).await).then_some(())
        },
    )
    .await;
    let http = gateway(Duration::from_secs(120));
    let own = format!("{}/busy", ns.name);
    wait_until("busy answers for itself", Duration::from_secs(60), || async {
        let (status, served_by, _) = ask(&http, &busy, "warm").await;
        (status == 200 && served_by == own).then_some(())
    })
    .await;
    let ask_n = |n: u32, max_tokens: u32| {
        let http = http.clone();
        let busy = busy.clone();
        async move {
            let r = http
                .post(format!("{}/v1/completions", gateway_url()))
                .json(
                    &json!({"model": busy, "prompt": "count", "n": n, "max_tokens": max_tokens,
                    "ignore_eos": true, "temperature": 0}),
                )
                .send()
                .await
                .expect("the gateway answers");
            let status = r.status().as_u16();
            let served_by = r.headers()["x-modelfleet-served-by"]
                .to_str()
                .unwrap()
                .to_string();
            (status, served_by, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // Eight long choices, one at a time: seven wait in busy's queue for seconds.
    let long = tokio::spawn(ask_n(8, 1900));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let series = |kind: &str| {
        format!(
            "modelfleet_gateway_tokens_total{{kind=\"{kind}\",model=\"{ext}\",model_deployment=\"provider:ext\",namespace=\"{}\",tenant=\"default\"}}",
            ns.name
        )
    };
    let metric = |text: &str, s: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(s))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    // The next request of eight would overfill the queue: busy's pod refuses it (429 `queue_full`),
    // and it moves to the provider.
    let (status, served_by, body) =
        wait_until("a request refused as saturated", Duration::from_secs(30), || {
            let ask = ask_n(8, 4);
            let own = own.clone();
            async move {
                let (status, served_by, body) = ask.await;
                (served_by != own).then_some((status, served_by, body))
            }
        })
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(served_by, "provider:ext");
    assert_eq!(body["model"], ext.as_str(), "ext's own answer");
    assert_eq!(body["choices"].as_array().unwrap().len(), 8);
    let (prompt, completion) = (
        body["usage"]["prompt_tokens"].as_f64().unwrap(),
        body["usage"]["completion_tokens"].as_f64().unwrap(),
    );
    let m = gateway_metrics().await;
    assert_eq!(
        metric(&m, &series("prompt")),
        prompt,
        "recorded with the provider: {m}"
    );
    assert_eq!(metric(&m, &series("completion")), completion, "{m}");
    let cost = format!(
        "modelfleet_gateway_cost_total{{currency=\"EUR\",model=\"{ext}\",model_deployment=\"provider:ext\",namespace=\"{}\",tenant=\"default\"}}",
        ns.name
    );
    let expected = (prompt * 3.0 + completion * 5.0) / 1e6;
    assert!(
        (metric(&m, &cost) - expected).abs() < 1e-12,
        "at the provider's prices: {m}"
    );
    eprintln!(
        "fallback: a saturated request answered by provider:ext ({prompt} prompt + {completion} completion tokens, {expected:.9} EUR)"
    );
    let (status, served_by, body) = long.await.unwrap();
    assert_eq!((status, served_by.as_str()), (200, own.as_str()), "{body}");
}
