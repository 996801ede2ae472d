//! The gateway's request path against test pods on loopback: affinity and the pod header, bodies
//! forwarded unchanged with the caller's `Authorization`, retries before the first byte (connect
//! refused, 503, 429 `queue_full`, an adapter's 404) and none after it or for a tenant's quota,
//! streams that end with an error event when their pod dies, cancellation reaching the pod, the
//! waiting room of a deployment without Ready pods, the edge's 401 before the body is read, and
//! answers passed through byte for byte.

mod common;
use common::*;
use modelfleet_api::tenants::Tenants;
use modelfleet_gateway::fleet::{Fleet, Tenancy};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn pod_of(headers: &reqwest::header::HeaderMap) -> String {
    headers
        .get("x-modelfleet-pod")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// `n` test pods behind a gateway, as one open deployment (every key accepted).
async fn open_fleet(n: usize) -> (Vec<TestPod>, TestGateway) {
    let (pods, port) = pods(n).await;
    let d = deployment(
        &pods.iter().map(|p| p.pod()).collect::<Vec<_>>(),
        Tenancy::Open,
        &[],
    );
    let gw = TestGateway::start(settings(port), Fleet::new(vec![d], true), 8).await;
    (pods, gw)
}

#[tokio::test]
async fn affinity_sends_a_prefix_to_one_pod_and_unique_prompts_spread() {
    let (pods, gw) = open_fleet(3).await;
    let url = gw.url("/v1/chat/completions");
    let mut homes = BTreeMap::new();
    for tenant_prompt in ["alpha system prompt", "beta system prompt", "gamma system prompt"] {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..5 {
            let (status, h, body) = post(&url, &chat(tenant_prompt, false), None).await;
            assert_eq!(status, 200, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["pod"], pod_of(&h), "the header names the pod that answered");
            seen.insert(pod_of(&h));
        }
        assert_eq!(seen.len(), 1, "one prompt prefix, one pod: {seen:?}");
        homes.insert(tenant_prompt, seen.into_iter().next().unwrap());
    }
    // Unique prompts spread over every pod.
    for i in 0..60 {
        let (status, _, _) = post(&url, &chat(&format!("{i} unique question"), false), None).await;
        assert_eq!(status, 200);
    }
    for p in &pods {
        assert!(p.hits() >= 10, "{} served {} of 75", p.name, p.hits());
    }
    // The body reached the pod unchanged (fields the gateway does not know included).
    let sent: serde_json::Value = serde_json::from_slice(
        &pods
            .iter()
            .find(|p| p.hits() > 0)
            .unwrap()
            .last_body
            .lock()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(sent["tools"][0]["type"], "function");
    assert!(
        gw.metrics()
            .contains("modelfleet_gateway_route_total{decision=\"affinity\",model_deployment=\"chat\"}")
    );
}

#[tokio::test]
async fn answers_pass_through_byte_for_byte() {
    // The overhead benchmark (examples/overhead_bench) compares these bytes both ways.
    let (pods, port) = pods(1).await;
    pods[0].set(Mode::Completion);
    let d = deployment(&[pods[0].pod()], Tenancy::Open, &[]);
    let gw = TestGateway::start(settings(port), Fleet::new(vec![d], true), 8).await;
    for (stream, expect) in [
        (false, COMPLETION.to_string()),
        (true, COMPLETION_CHUNKS.concat()),
    ] {
        let (status, h, body) = post(&gw.url("/v1/chat/completions"), &chat("hi", stream), None).await;
        assert_eq!((status, body.as_str()), (200, expect.as_str()));
        let kind = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        assert_eq!(h["content-type"], kind);
    }
}

#[tokio::test]
async fn failures_before_the_first_byte_are_retried_elsewhere() {
    let (mut pods, gw) = open_fleet(3).await;
    let url = gw.url("/v1/chat/completions");
    let (_, h, _) = post(&url, &chat("pinned", false), None).await;
    let home = pod_of(&h);
    let home_index = pods.iter().position(|p| p.name == home).unwrap();

    for mode in [
        Mode::Status(503, "shutting_down"),
        Mode::Status(429, "queue_full"),
    ] {
        pods[home_index].set(mode.clone());
        let (status, h, body) = post(&url, &chat("pinned", false), None).await;
        assert_eq!(status, 200, "{mode:?}: {body}");
        assert_ne!(pod_of(&h), home, "{mode:?} was not retried elsewhere");
    }
    // A tenant's quota is never retried; it reaches the client with Retry-After.
    pods[home_index].set(Mode::Status(429, "tenant_quota"));
    let (status, h, body) = post(&url, &chat("pinned", false), None).await;
    assert_eq!((status, pod_of(&h).as_str()), (429, home.as_str()), "{body}");
    assert_eq!(h.get("retry-after").unwrap(), "1");
    assert!(body.contains("tenant_quota"));
    // Connection refused: retried, and the pod is ejected so the next request does not try it.
    pods[home_index].kill();
    let hits_before: usize = pods.iter().map(|p| p.hits()).sum();
    let (status, h, _) = post(&url, &chat("pinned", false), None).await;
    assert_eq!(status, 200);
    assert_ne!(pod_of(&h), home);
    assert!(gw.gw.loads.ejected(&home));
    assert_eq!(pods.iter().map(|p| p.hits()).sum::<usize>(), hits_before + 1);
    assert!(
        gw.metrics()
            .contains("modelfleet_gateway_retries_total{model_deployment=\"chat\"} 3")
    );
    // Every pod failing: the last answer goes back as the pod gave it, after at most 1 + 2 attempts.
    for p in &pods {
        p.set(Mode::Status(503, "shutting_down"));
    }
    let (status, _, body) = post(&url, &chat("other", false), None).await;
    assert_eq!(status, 503, "{body}");
}

#[tokio::test]
async fn a_broken_connection_is_retried_once_and_only_while_its_pod_lives() {
    let (pods, gw) = open_fleet(3).await;
    let url = gw.url("/v1/chat/completions");
    let (_, h, _) = post(&url, &chat("pinned", false), None).await;
    let home = pod_of(&h);
    let home_index = pods.iter().position(|p| p.name == home).unwrap();
    let hits = |pods: &[TestPod]| pods.iter().map(|p| p.hits()).sum::<usize>();

    // The pod dropped the connection but is still there: once more, elsewhere.
    pods[home_index].set(Mode::Reset);
    let before = hits(&pods);
    let (status, h, body) = post(&url, &chat("pinned", false), None).await;
    assert_eq!(status, 200, "{body}");
    assert_ne!(pod_of(&h), home);
    assert_eq!(hits(&pods), before + 2);
    assert!(gw.metrics().contains(
        "modelfleet_gateway_upstream_resets_total{model_deployment=\"chat\",verdict=\"pod_alive\"} 1"
    ));
    // Every live pod dropping it: two attempts, then the client hears why (never a third pod).
    for p in &pods {
        p.set(Mode::Reset);
    }
    let before = hits(&pods);
    let (status, _, body) = post(&url, &chat("pinned", false), None).await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("upstream_failed"), "{body}");
    assert_eq!(
        hits(&pods),
        before + 2,
        "at most one retry after a broken connection"
    );

    // The pod went away while handling it: a poison request may have killed it, so no other pod
    // gets it; the pod is ejected and the client hears which replica failed.
    for p in &pods {
        p.set(Mode::Ok);
    }
    pods[home_index].set(Mode::Crash);
    let before = hits(&pods);
    let (status, _, body) = post(&url, &chat("pinned", false), None).await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body.contains("upstream_failed") && body.contains("went away") && body.contains(&home),
        "{body}"
    );
    assert_eq!(hits(&pods), before + 1, "the request reached one pod only");
    assert!(gw.gw.loads.ejected(&home));
    assert!(gw.metrics().contains(
        "modelfleet_gateway_upstream_resets_total{model_deployment=\"chat\",verdict=\"pod_gone\"} 1"
    ));
    // The next request goes to a live pod.
    let (status, h, _) = post(&url, &chat("pinned", false), None).await;
    assert_eq!(status, 200);
    assert_ne!(pod_of(&h), home);
}

#[tokio::test]
async fn nothing_is_retried_once_streaming_and_a_dying_stream_ends_with_an_error_event() {
    let (pods, gw) = open_fleet(2).await;
    let url = gw.url("/v1/chat/completions");
    for p in &pods {
        p.set(Mode::DieMidStream);
    }
    let t0 = Instant::now();
    let (status, _, body) = post(&url, &chat("s", true), None).await;
    assert_eq!(status, 200);
    assert!(t0.elapsed() < Duration::from_secs(3), "the stream hung");
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 3, "{body}");
    assert!(events[0].contains("\"pod\""));
    assert!(
        events[1].contains("\"error\"") && events[1].contains("upstream_failed"),
        "{body}"
    );
    assert_eq!(events[2], "data: [DONE]");
    assert_eq!(
        pods.iter().map(|p| p.hits()).sum::<usize>(),
        1,
        "retried after the first byte"
    );
    assert!(gw.metrics().contains("outcome=\"stream_error\""));
    // A healthy stream passes through untouched.
    pods[0].set(Mode::Ok);
    pods[1].set(Mode::Ok);
    let (_, _, body) = post(&url, &chat("s", true), None).await;
    assert!(
        body.ends_with("data: [DONE]\n\n") && !body.contains("error"),
        "{body}"
    );
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_pods_request() {
    let (pods, port) = pods(1).await;
    let d = deployment(&[pods[0].pod()], Tenancy::Open, &[]);
    let gw = TestGateway::start(settings(port), Fleet::new(vec![d], true), 8).await;
    // Mid-stream.
    pods[0].set(Mode::Endless);
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("s", true))
        .send()
        .await
        .unwrap();
    let mut resp = resp;
    assert!(resp.chunk().await.unwrap().is_some());
    assert_eq!(gw.gw.loads.inflight(&pods[0].name), 1);
    drop(resp);
    wait_for("the pod's stream to be dropped", || {
        pods[0].dropped.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    wait_for("the in-flight count to return to 0", || {
        gw.gw.loads.inflight(&pods[0].name) == 0
    })
    .await;
    // Before the first byte.
    pods[0].set(Mode::Slow);
    let url = gw.url("/v1/chat/completions");
    let req = tokio::spawn(async move { client().post(url).json(&chat("s", false)).send().await });
    wait_for("the slow request to reach the pod", || pods[0].hits() == 2).await;
    req.abort();
    wait_for("the pod's request to be dropped", || {
        pods[0].dropped.load(std::sync::atomic::Ordering::SeqCst) == 2
    })
    .await;
    wait_for("the in-flight count to return to 0", || {
        gw.gw.loads.inflight(&pods[0].name) == 0
    })
    .await;
    assert!(gw.metrics().contains("outcome=\"cancelled\""));
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_deployment_without_ready_pods_holds_requests_until_one_is_ready() {
    let (pods, port) = pods(1).await;
    let empty = deployment(&[], Tenancy::Open, &[]);
    let mut s = settings(port);
    s.max_pending_wait = Duration::from_millis(1500);
    let gw = Arc::new(TestGateway::start(s, Fleet::new(vec![empty.clone()], true), 2).await);
    let url = gw.url("/v1/chat/completions");
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { post(&url, &chat("cold", false), None).await })
        })
        .collect();
    let g = gw.clone();
    wait_for("two pending requests", move || {
        g.metrics()
            .contains("modelfleet_gateway_pending_requests{model_deployment=\"chat\",namespace=\"ns\"} 2")
    })
    .await;
    // The room is full: a third is refused at once with Retry-After.
    let (status, h, body) = post(&url, &chat("cold", false), None).await;
    assert_eq!(
        (status, h.get("retry-after").map(|v| v.to_str().unwrap())),
        (429, Some("5")),
        "{body}"
    );
    // A pod turns Ready: both are served.
    gw.publish(vec![deployment(&[pods[0].pod()], Tenancy::Open, &[])]);
    for w in waiting {
        let (status, _, body) = w.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    assert!(
        gw.metrics()
            .contains("modelfleet_gateway_pending_requests{model_deployment=\"chat\",namespace=\"ns\"} 0")
    );
    // No pod within the wait: 504.
    gw.publish(vec![empty]);
    let t0 = Instant::now();
    let (status, _, body) = post(&url, &chat("cold", false), None).await;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("no_ready_replica"));
    assert!(t0.elapsed() >= Duration::from_millis(1400));
}

fn keyed() -> Tenancy {
    Tenancy::Keys(Arc::new(
        Tenants::parse(
            "tenants:\n- id: a\n  apiKeys: [sk-tenant-a]\n  maxConcurrentRequests: 1\n- id: b\n  apiKeys: [sk-tenant-b]\n",
        )
        .unwrap(),
    ))
}

#[tokio::test]
async fn unknown_keys_are_refused_before_the_body_is_read() {
    let (pods, port) = pods(1).await;
    let d = deployment(&[pods[0].pod()], keyed(), &[]);
    let gw = TestGateway::start(settings(port), Fleet::new(vec![d], true), 8).await;
    for key in ["", "Authorization: Bearer sk-nobody-1\r\n"] {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        // Headers promising a body that never comes: the answer must not wait for it.
        s.write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
                 content-length: 100000\r\n{key}\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf))
            .await
            .expect("answered without the body")
            .unwrap();
        let head = String::from_utf8_lossy(&buf[..n]);
        assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    }
    assert_eq!(pods[0].hits(), 0);
    // A known key gets through, and its Authorization reaches the pod unchanged.
    let (status, _, _) = post(
        &gw.url("/v1/chat/completions"),
        &chat("x", false),
        Some("sk-tenant-b"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        pods[0].last_auth.lock().unwrap().as_deref(),
        Some("Bearer sk-tenant-b")
    );
}

#[tokio::test]
async fn adapters_route_to_pods_that_have_them_and_quotas_hold_fleet_wide() {
    let (pods, port) = pods(3).await;
    let all: Vec<_> = pods.iter().map(|p| p.pod()).collect();
    let d = deployment(&all, keyed(), &[("sql", &["a"], &[&pods[2].name])]);
    let gw = TestGateway::start(settings(port), Fleet::new(vec![d], true), 8).await;
    let url = gw.url("/v1/chat/completions");
    let body = |p: &str| serde_json::json!({"model": "sql", "messages": [{"role": "user", "content": p}]});
    for i in 0..6 {
        let (status, h, text) = post(&url, &body(&format!("q{i}")), Some("sk-tenant-a")).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(pod_of(&h), pods[2].name, "only the pod with the adapter loaded");
    }
    // Tenant b may not use it: the same 404 as a name that does not exist; it is not listed either.
    let (status, _, text) = post(&url, &body("q"), Some("sk-tenant-b")).await;
    let (status2, _, text2) = post(
        &url,
        &serde_json::json!({"model": "nope", "messages": []}),
        Some("sk-tenant-b"),
    )
    .await;
    assert_eq!((status, status2), (404, 404));
    assert_eq!(text.replace("sql", "X"), text2.replace("nope", "X"));
    let models = |key: &'static str| {
        let url = gw.url("/v1/models");
        async move {
            let v: serde_json::Value = client()
                .get(url)
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(models("sk-tenant-a").await, ["llama", "sql"]);
    assert_eq!(models("sk-tenant-b").await, ["llama"]);
    // The pod's 404 for an adapter (its status lagging) is retried on another pod.
    pods[2].set(Mode::Status(404, "model_not_found"));
    let d = deployment(&all, keyed(), &[("sql", &["a"], &[])]);
    gw.publish(vec![d]);
    for i in 0..4 {
        let (status, h, text) = post(&url, &body(&format!("late {i}")), Some("sk-tenant-a")).await;
        assert_eq!(status, 200, "{text}");
        assert_ne!(pod_of(&h), pods[2].name);
    }
    // maxConcurrentRequests 1 for tenant a, counted at the gateway across pods.
    pods[0].set(Mode::Slow);
    pods[1].set(Mode::Slow);
    pods[2].set(Mode::Slow);
    let u = url.clone();
    let first = tokio::spawn(async move { post(&u, &chat("hold", false), Some("sk-tenant-a")).await });
    wait_for("the first request in flight", || {
        pods.iter().map(|p| gw.gw.loads.inflight(&p.name)).sum::<u64>() == 1
    })
    .await;
    let (status, h, text) = post(&url, &chat("other", false), Some("sk-tenant-a")).await;
    assert_eq!((status, pod_of(&h).as_str()), (429, ""), "{text}");
    assert!(text.contains("tenant_quota") && text.contains("maxConcurrentRequests 1"));
    first.abort();
}

#[tokio::test]
async fn oversized_bodies_and_bad_json_are_refused_by_the_gateway() {
    let (pods, port) = pods(1).await;
    let d = deployment(&[pods[0].pod()], Tenancy::Open, &[]);
    let gw = TestGateway::start(settings(port), Fleet::new(vec![d], true), 8).await;
    let big = serde_json::json!({"model": "llama", "prompt": "x".repeat(100 << 10)});
    let (status, _, body) = post(&gw.url("/v1/completions"), &big, None).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("65536 bytes"));
    let r = client()
        .post(gw.url("/v1/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let (status, _, body) = post(
        &gw.url("/v1/completions"),
        &serde_json::json!({"prompt": "x"}),
        None,
    )
    .await;
    assert_eq!(status, 400);
    assert!(body.contains("`model` is required"));
    let (status, _, _) = post(
        &gw.url("/v1/completions"),
        &serde_json::json!({"model": "other", "prompt": "x"}),
        None,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(pods[0].hits(), 0);
}
