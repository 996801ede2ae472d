//! `spec.fallback` against test pods on loopback: a deployment without Ready pods hands its requests
//! to its fallback after the wait and takes them back once a pod is Ready; a saturated one (every pod
//! 429 `queue_full`) moves them, a reset never; a target that does not know the caller's key as the
//! same tenant is passed over; the moved request carries the target's model name, and every answer
//! names the deployment that gave it.

mod common;
use common::*;
use modelfleet_api::tenants::Tenants;
use modelfleet_crds::{FallbackSpec, FallbackTarget, FallbackTrigger};
use modelfleet_gateway::fleet::{Deployment, DeploymentId, Fleet, Pod, Tenancy};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SERVED_BY: &str = "x-modelfleet-served-by";

fn keys(text: &str) -> Tenancy {
    Tenancy::Keys(Arc::new(Tenants::parse(text).unwrap()))
}

/// `chat` (serving `llama`) on `pods`, falling back to `targets` after a `wait`-second wait.
fn primary(pods: &[Pod], tenancy: Tenancy, wait: i32, targets: &[(&str, &[FallbackTrigger])]) -> Deployment {
    let mut d = deployment(pods, tenancy, &[]);
    d.fallback = Some(Arc::new(FallbackSpec {
        no_ready_replica_wait_seconds: wait,
        first_token_deadline_milliseconds: None,
        targets: targets
            .iter()
            .map(|(name, on)| FallbackTarget {
                model_deployment: Some(name.to_string()),
                provider: None,
                triggers: on.to_vec(),
            })
            .collect(),
    }));
    d
}

/// `d` with a first-token deadline of `ms`.
fn with_deadline(mut d: Deployment, ms: i32) -> Deployment {
    let mut spec = (**d.fallback.as_ref().unwrap()).clone();
    spec.first_token_deadline_milliseconds = Some(ms);
    d.fallback = Some(Arc::new(spec));
    d
}

/// Deployment `name` serving `served` on `pods`.
fn other(name: &str, served: &str, pods: &[Pod], tenancy: Tenancy) -> Deployment {
    let mut d = deployment(pods, tenancy, &[]);
    d.id = DeploymentId {
        namespace: "ns".into(),
        name: name.into(),
    };
    d.served_name = served.into();
    d
}

fn fallbacks(gw: &TestGateway, reason: &str, result: &str) -> f64 {
    gw.metrics()
        .lines()
        .filter(|l| {
            l.starts_with("modelfleet_gateway_fallbacks_total{")
                && l.contains(&format!("reason=\"{reason}\""))
                && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_deployment_without_ready_pods_hands_requests_to_its_fallback_then_takes_them_back() {
    let (pods, port) = pods(2).await;
    let (big, small) = (pods[0].pod(), pods[1].pod());
    let fleet = Fleet::new(
        vec![
            primary(
                &[],
                Tenancy::Open,
                1,
                &[("small", &[FallbackTrigger::NoReadyReplica])],
            ),
            other("small", "smol", std::slice::from_ref(&small), Tenancy::Open),
        ],
        true,
    );
    let gw = TestGateway::start(settings(port), fleet, 8).await;
    for stream in [false, true] {
        let began = Instant::now();
        let (status, h, body) = post(&gw.url("/v1/chat/completions"), &chat("hello", stream), None).await;
        let took = began.elapsed();
        assert_eq!(status, 200, "{body}");
        assert_eq!(header(&h, SERVED_BY), "ns/small");
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "moved after the 1 s wait, not before and not at the 5 s pending limit: {took:?}"
        );
        if stream {
            assert!(body.contains("data: [DONE]"), "{body}");
        }
        let sent: serde_json::Value = serde_json::from_slice(&pods[1].last_body.lock().unwrap()).unwrap();
        assert_eq!(sent["model"], "smol", "the target's own name");
        assert_eq!(sent["messages"][0]["content"], "hello");
    }
    assert_eq!(fallbacks(&gw, "no_ready_replica", "moved"), 2.0);
    assert!(
        gw.metrics().contains(
            "modelfleet_gateway_fallbacks_total{model_deployment=\"chat\",namespace=\"ns\",reason=\"no_ready_replica\",result=\"moved\",target=\"small\"} 2"
        ),
        "counted for the deployment the requests were sent to (the operator's demand): {}",
        gw.metrics()
    );
    // A pod of its own turns Ready: requests stay.
    gw.publish(vec![
        primary(
            std::slice::from_ref(&big),
            Tenancy::Open,
            1,
            &[("small", &[FallbackTrigger::NoReadyReplica])],
        ),
        other("small", "smol", std::slice::from_ref(&small), Tenancy::Open),
    ]);
    let (status, h, body) = post(&gw.url("/v1/chat/completions"), &chat("hello", false), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&h, SERVED_BY), "ns/chat");
    assert_eq!(header(&h, "x-modelfleet-pod"), big.name);
    assert_eq!((pods[0].hits(), pods[1].hits()), (1, 2));
}

#[tokio::test]
async fn saturation_moves_a_request_a_reset_never_does() {
    let (pods, port) = pods(3).await;
    let ours = [pods[0].pod(), pods[1].pod()];
    let fleet = Fleet::new(
        vec![
            primary(
                &ours,
                Tenancy::Open,
                1,
                &[("small", &[FallbackTrigger::Saturated])],
            ),
            other("small", "smol", &[pods[2].pod()], Tenancy::Open),
        ],
        true,
    );
    let gw = TestGateway::start(settings(port), fleet, 8).await;
    for p in &pods[..2] {
        p.set(Mode::Status(429, "queue_full"));
    }
    let (status, h, body) = post(&gw.url("/v1/chat/completions"), &chat("busy", true), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&h, SERVED_BY), "ns/small");
    assert_eq!((pods[0].hits(), pods[1].hits(), pods[2].hits()), (1, 1, 1));
    assert_eq!(fallbacks(&gw, "saturated", "moved"), 1.0);
    // A connection reset may mean the request started: it is retried once, never moved.
    for p in &pods[..2] {
        p.set(Mode::Reset);
    }
    let (status, h, body) = post(&gw.url("/v1/chat/completions"), &chat("reset", false), None).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(header(&h, SERVED_BY), "ns/chat");
    assert_eq!(pods[2].hits(), 1, "nothing moved after a reset");
    // Without a target for the trigger, the wait is not cut short and nothing moves.
    gw.publish(vec![
        primary(&[], Tenancy::Open, 1, &[("small", &[FallbackTrigger::Saturated])]),
        other("small", "smol", &[pods[2].pod()], Tenancy::Open),
    ]);
    let began = Instant::now();
    let (status, _, body) = post(&gw.url("/v1/chat/completions"), &chat("nobody", false), None).await;
    assert_eq!(status, 504, "{body}");
    assert!(
        began.elapsed() >= Duration::from_secs(4),
        "the whole pending wait"
    );
    assert_eq!(pods[2].hits(), 1);
}

#[tokio::test]
async fn a_target_that_does_not_know_the_callers_key_as_the_same_tenant_is_passed_over() {
    let (pods, port) = pods(3).await;
    let a = "tenants:\n- id: a\n  apiKeys: [sk-tenant-a]\n";
    let elsewhere = "tenants:\n- id: other\n  apiKeys: [sk-tenant-a]\n";
    let fleet = Fleet::new(
        vec![
            primary(
                &[pods[0].pod()],
                keys(a),
                1,
                &[("stranger", &[]), ("missing", &[]), ("small", &[])],
            ),
            other("stranger", "strange", &[pods[1].pod()], keys(elsewhere)),
            other("small", "smol", &[pods[2].pod()], keys(a)),
        ],
        true,
    );
    let gw = TestGateway::start(settings(port), fleet, 8).await;
    pods[0].set(Mode::Status(429, "queue_full"));
    let (status, h, body) = post(
        &gw.url("/v1/chat/completions"),
        &chat("hi", false),
        Some("sk-tenant-a"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&h, SERVED_BY), "ns/small");
    assert_eq!(
        pods[1].hits(),
        0,
        "the same key names another tenant there: never sent"
    );
    assert_eq!(
        *pods[2].last_auth.lock().unwrap(),
        Some("Bearer sk-tenant-a".into())
    );
    assert_eq!(fallbacks(&gw, "saturated", "other_tenant"), 1.0);
    assert_eq!(fallbacks(&gw, "saturated", "no_deployment"), 1.0);
    assert_eq!(fallbacks(&gw, "saturated", "moved"), 1.0);
    // With nowhere to go, the client hears the deployment's own refusal.
    pods[2].set(Mode::Status(429, "queue_full"));
    let (status, h, body) = post(
        &gw.url("/v1/chat/completions"),
        &chat("hi", false),
        Some("sk-tenant-a"),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("queue_full"), "{body}");
    assert_eq!(
        header(&h, SERVED_BY),
        "ns/small",
        "the last deployment that refused"
    );
}

#[tokio::test]
async fn a_first_token_deadline_moves_a_request_the_pod_gave_up_or_that_stayed_silent() {
    let (pods, port) = pods(3).await;
    let ours = [pods[0].pod(), pods[1].pod()];
    let late = [("small", &[FallbackTrigger::FirstTokenDeadline][..])];
    let fleet = Fleet::new(
        vec![
            with_deadline(primary(&ours, Tenancy::Open, 1, &late), 1000),
            other("small", "smol", &[pods[2].pod()], Tenancy::Open),
        ],
        true,
    );
    let gw = TestGateway::start(settings(port), fleet, 8).await;
    // The pod gives the request up at the deadline it was told (its 504 `first_token_deadline`): the
    // request moves at once, and is not retried on the deployment's other pod.
    for p in &pods[..2] {
        p.set(Mode::Status(504, "first_token_deadline"));
    }
    let (status, h, body) = post(&gw.url("/v1/chat/completions"), &chat("slow", true), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&h, SERVED_BY), "ns/small");
    assert_eq!(
        pods[0].hits() + pods[1].hits(),
        1,
        "one pod of the slow deployment, once"
    );
    let told: u64 = [&pods[0], &pods[1]]
        .iter()
        .find_map(|p| p.last_deadline.lock().unwrap().clone())
        .expect("the pod was told the deadline")
        .parse()
        .unwrap();
    assert!((1..=1000).contains(&told), "what is left of 1000 ms: {told}");
    assert_eq!(
        *pods[2].last_deadline.lock().unwrap(),
        None,
        "the last target has no deadline: nothing to move to after it"
    );
    assert_eq!(fallbacks(&gw, "first_token_deadline", "moved"), 1.0);
    // A stream's pod silent past the deadline (and the grace for its own answer) is cut — the
    // connection closed, so it cancels the request — and the request moves. (A JSON answer's first
    // byte comes with its last token: there only the pod's own 504 moves it.)
    for p in &pods[..2] {
        p.set(Mode::Slow);
    }
    let began = Instant::now();
    let (status, h, body) = post(&gw.url("/v1/chat/completions"), &chat("silent", true), None).await;
    let took = began.elapsed();
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&h, SERVED_BY), "ns/small");
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_millis(3_000),
        "moved at the deadline plus the grace: {took:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        pods[0].dropped.load(std::sync::atomic::Ordering::SeqCst)
            + pods[1].dropped.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the silent attempt was cut"
    );
    // A caller may shorten the deadline, never lengthen it; a bad value is a 400 naming the header.
    let began = Instant::now();
    let url = gw.url("/v1/chat/completions");
    let shorter = [("x-modelfleet-first-token-deadline-ms", "100")];
    let (status, h, _) = post_with(&url, &chat("hurry", true), None, &shorter).await;
    assert_eq!((status, header(&h, SERVED_BY)), (200, "ns/small".into()));
    assert!(
        began.elapsed() < Duration::from_millis(1000),
        "the caller's 100 ms, not the deployment's 1000: {:?}",
        began.elapsed()
    );
    let longer = [("x-modelfleet-first-token-deadline-ms", "60000")];
    let began = Instant::now();
    let (status, _, _) = post_with(&url, &chat("patient", true), None, &longer).await;
    assert_eq!(status, 200);
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "still 1000 ms: {:?}",
        began.elapsed()
    );
    let bad = [("x-modelfleet-first-token-deadline-ms", "0")];
    let (status, _, body) = post_with(&url, &chat("bad", false), None, &bad).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("x-modelfleet-first-token-deadline-ms"), "{body}");
}

#[tokio::test]
async fn a_stream_that_sent_its_first_byte_never_moves() {
    let (pods, port) = pods(2).await;
    let late = [("small", &[FallbackTrigger::FirstTokenDeadline][..])];
    let fleet = Fleet::new(
        vec![
            with_deadline(primary(&[pods[0].pod()], Tenancy::Open, 1, &late), 200),
            other("small", "smol", &[pods[1].pod()], Tenancy::Open),
        ],
        true,
    );
    let gw = TestGateway::start(settings(port), fleet, 8).await;
    // A tick every 50 ms: the first byte comes in time, and the stream runs well past the deadline.
    pods[0].set(Mode::Endless);
    let resp = common::client()
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("long", true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(resp.headers(), SERVED_BY), "ns/chat");
    let mut resp = resp;
    let began = Instant::now();
    let mut ticks = 0;
    while began.elapsed() < Duration::from_millis(800) {
        let chunk = resp.chunk().await.unwrap().expect("the stream goes on");
        ticks += String::from_utf8_lossy(&chunk).matches("tick").count();
    }
    assert!(ticks >= 10, "{ticks} ticks");
    drop(resp);
    // And when its pod dies midway, it ends with an error event: never replayed elsewhere.
    pods[0].set(Mode::DieMidStream);
    let (status, h, body) = post(&gw.url("/v1/chat/completions"), &chat("dies", true), None).await;
    assert_eq!((status, header(&h, SERVED_BY)), (200, "ns/chat".into()));
    assert!(body.contains("\"error\"") && body.contains("[DONE]"), "{body}");
    assert_eq!(pods[1].hits(), 0, "nothing moved");
    assert_eq!(fallbacks(&gw, "first_token_deadline", "moved"), 0.0);
}

/// `chat` on `pods` falling back, when saturated, to provider `ext` at `base` (asking `gpt-mini`,
/// with `key`, at 1 and 2 EUR per million prompt and completion tokens).
fn to_provider(pods: &[Pod], tenancy: Tenancy, base: &str, key: Result<Option<&str>, &str>) -> Deployment {
    let spec: modelfleet_crds::ProviderTarget = serde_json::from_value(serde_json::json!({
        "name": "ext", "baseUrl": base, "model": "gpt-mini", "timeoutSeconds": 5,
        "apiKeySecretRef": {"name": "ext-key"},
        "inputPerMillionTokens": "1", "outputPerMillionTokens": "2"}))
    .unwrap();
    let mut d = deployment(pods, tenancy, &[]);
    d.fallback = Some(Arc::new(FallbackSpec {
        no_ready_replica_wait_seconds: 1,
        first_token_deadline_milliseconds: None,
        targets: vec![FallbackTarget {
            model_deployment: None,
            provider: Some(spec.clone()),
            triggers: vec![FallbackTrigger::Saturated],
        }],
    }));
    let key = key.map(|k| k.map(Arc::from)).map_err(String::from);
    let provider = modelfleet_gateway::provider::Provider::new(&spec, key, "EUR");
    d.providers.insert("ext".into(), Arc::new(provider));
    d
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn a_provider_answers_with_its_own_key_and_its_usage_is_priced_with_its_prices() {
    let (pods, port) = pods(2).await;
    let a = "tenants:\n- id: a\n  apiKeys: [sk-tenant-a]\n";
    let base = format!("http://{}:{port}/v1", pods[1].ip);
    let fleet = Fleet::new(
        vec![to_provider(
            &[pods[0].pod()],
            keys(a),
            &base,
            Ok(Some("sk-provider")),
        )],
        true,
    );
    let gw = TestGateway::start(settings(port), fleet, 8).await;
    pods[0].set(Mode::Status(429, "queue_full"));
    pods[1].set(Mode::Completion);
    let url = gw.url("/v1/chat/completions");
    let (status, h, body) = post(&url, &chat("hi", false), Some("sk-tenant-a")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&h, SERVED_BY), "provider:ext");
    assert_eq!(body, COMPLETION, "the provider's answer, unchanged");
    assert_eq!(
        *pods[1].last_auth.lock().unwrap(),
        Some("Bearer sk-provider".into()),
        "the provider's key, never the caller's"
    );
    let sent: serde_json::Value = serde_json::from_slice(&pods[1].last_body.lock().unwrap()).unwrap();
    assert_eq!(sent["model"], "gpt-mini");
    // A stream: the provider is asked for its usage chunk, which the client (who did not ask) does
    // not see; the meter reads it.
    let (status, h, body) = post(&url, &chat("hi", true), Some("sk-tenant-a")).await;
    assert_eq!((status, header(&h, SERVED_BY)), (200, "provider:ext".into()));
    let sent: serde_json::Value = serde_json::from_slice(&pods[1].last_body.lock().unwrap()).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert!(!body.contains("\"usage\""), "{body}");
    assert!(
        body.contains(": modelfleet-usage prompt=20 cached=5 completion=3"),
        "{body}"
    );
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    // Usage: 20 + 20 prompt tokens (5 cached), 9 + 3 completion tokens, at the provider's prices.
    let series = |kind: &str| {
        format!(
            "modelfleet_gateway_tokens_total{{kind=\"{kind}\",model=\"gpt-mini\",model_deployment=\"provider:ext\",namespace=\"ns\",tenant=\"a\"}}"
        )
    };
    let t0 = Instant::now();
    while metric(&gw.metrics(), &series("completion")) != Some(12.0) {
        assert!(t0.elapsed() < Duration::from_secs(5), "{}", gw.metrics());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = gw.metrics();
    assert_eq!(metric(&m, &series("prompt")), Some(40.0), "{m}");
    let cost = "modelfleet_gateway_cost_total{currency=\"EUR\",model=\"gpt-mini\",model_deployment=\"provider:ext\",namespace=\"ns\",tenant=\"a\"}";
    let expected = (40.0 * 1.0 + 12.0 * 2.0) / 1e6;
    assert!((metric(&m, cost).unwrap() - expected).abs() < 1e-12, "{m}");
    assert_eq!(fallbacks(&gw, "saturated", "moved"), 2.0);
    assert!(m.contains("target=\"provider:ext\""), "{m}");
    // The provider's own error goes to the client as it gave it.
    pods[1].set(Mode::Status(429, "rate_limit_exceeded"));
    let (status, h, body) = post(&url, &chat("hi", false), Some("sk-tenant-a")).await;
    assert_eq!((status, header(&h, SERVED_BY)), (429, "provider:ext".into()));
    assert!(body.contains("rate_limit_exceeded"), "{body}");
}

#[tokio::test]
async fn a_provider_whose_key_cannot_be_read_is_passed_over() {
    let (pods, port) = pods(2).await;
    let base = format!("http://{}:{port}/v1", pods[1].ip);
    let why = Err("the provider key Secret ns/ext-key does not exist");
    let fleet = Fleet::new(
        vec![to_provider(&[pods[0].pod()], Tenancy::Open, &base, why)],
        true,
    );
    let gw = TestGateway::start(settings(port), fleet, 8).await;
    pods[0].set(Mode::Status(429, "queue_full"));
    let (status, h, body) = post(&gw.url("/v1/chat/completions"), &chat("hi", false), None).await;
    assert_eq!((status, header(&h, SERVED_BY)), (429, "ns/chat".into()), "{body}");
    assert_eq!(pods[1].hits(), 0);
    assert_eq!(fallbacks(&gw, "saturated", "no_key"), 1.0);
}

#[tokio::test]
async fn a_moved_answer_carries_the_rate_limits_it_was_charged_to() {
    let (pods, port) = pods(2).await;
    let here = "tenants:\n- id: a\n  apiKeys: [sk-tenant-a]\n  requestsPerMinute: 600\n";
    let there = "tenants:\n- id: a\n  apiKeys: [sk-tenant-a]\n  requestsPerMinute: 60\n";
    let fleet = Fleet::new(
        vec![
            primary(
                &[pods[0].pod()],
                keys(here),
                1,
                &[("small", &[FallbackTrigger::Saturated])],
            ),
            other("small", "smol", &[pods[1].pod()], keys(there)),
        ],
        true,
    );
    let gw = TestGateway::start(settings(port), fleet, 8).await;
    let url = gw.url("/v1/chat/completions");
    let (status, h, _) = post(&url, &chat("hi", false), Some("sk-tenant-a")).await;
    assert_eq!((status, header(&h, SERVED_BY)), (200, "ns/chat".into()));
    assert_eq!(header(&h, "x-ratelimit-limit-requests"), "600");
    pods[0].set(Mode::Status(429, "queue_full"));
    let (status, h, _) = post(&url, &chat("hi", false), Some("sk-tenant-a")).await;
    assert_eq!((status, header(&h, SERVED_BY)), (200, "ns/small".into()));
    assert_eq!(
        header(&h, "x-ratelimit-limit-requests"),
        "60",
        "the target's limits, which the request was charged to"
    );
    assert_eq!(header(&h, "x-ratelimit-remaining-requests"), "59");
}
