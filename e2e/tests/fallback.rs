//! `spec.fallback` through the fleet gateway on the local cluster (the chart's gateway at
//! `MF_GATEWAY_URL`, the operator's autoscaler, the real runtime): a deployment resting at zero replicas
//! hands its requests to its fallback deployment at once (`noReadyReplicaWaitSeconds: 0`) — each answer
//! naming the deployment that gave it (`x-modelfleet-served-by`) — and those moves alone are demand
//! enough for the operator to scale it from zero; once its own pod is Ready it answers them itself.
//! (The gateway tests cover the wait itself.) Run by `make e2e`.

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
async fn a_deployment_at_zero_hands_requests_to_its_fallback_while_it_scales_up() {
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
    assert_eq!((status, served_by), (200, own));
    eprintln!("fallback: big answered directly in {:?}", began.elapsed());
}
