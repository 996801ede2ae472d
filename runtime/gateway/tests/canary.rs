//! Canary routing against test pods on loopback: the split is sticky per conversation and follows the
//! weight; retries stay within the chosen revision and fall back to the other one only when it has no
//! pod left; a mirrored copy never changes (nor delays) the client's answer, and is judged for the
//! canary with `mirrored="true"`; the per-revision metrics count what each revision served.

mod common;
use common::*;
use modelfleet_gateway::canary::Split;
use modelfleet_gateway::fleet::{Deployment, Pod, Tenancy};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// `pods` as deployment `ns/chat`, pod `i` of revision `revs[i]`, split r1 → r2 if `split` is given.
fn rolled(pods: &[TestPod], revs: &[&str], split: Option<(u32, u32)>) -> Deployment {
    let ps: Vec<Pod> = pods
        .iter()
        .zip(revs)
        .map(|(p, r)| Pod {
            revision: r.to_string(),
            ..p.pod()
        })
        .collect();
    let mut d = deployment(&ps, Tenancy::Open, &[]);
    d.split = split.map(|(weight, mirror_percent)| Split {
        stable: "r1".into(),
        canary: "r2".into(),
        weight,
        mirror_percent,
    });
    d
}

async fn start(port: u16, d: Deployment) -> TestGateway {
    let gw = TestGateway::start(settings(port), Default::default(), 8).await;
    gw.publish(vec![d]);
    gw
}

/// Posts a chat; returns the status, the serving pod and the body.
async fn ask(gw: &TestGateway, prompt: &str, stream: bool) -> (u16, String, String) {
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-caller-1")
        .json(&chat(prompt, stream))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let pod = resp
        .headers()
        .get("x-modelfleet-pod")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, pod, resp.text().await.unwrap())
}

fn revision_requests(gw: &TestGateway, rev: &str, outcome: &str, mirrored: &str) -> u64 {
    let l = ["ns", "chat", rev, outcome, mirrored];
    gw.gw.metrics.revisions.requests.with_label_values(&l).get()
}

fn routed(gw: &TestGateway, rev: &str, reason: &str) -> u64 {
    let l = ["ns", "chat", rev, reason];
    gw.gw.metrics.revisions.route.with_label_values(&l).get()
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_split_is_sticky_per_conversation_and_follows_the_weight() {
    let (pods, port) = pods(4).await;
    let revs = ["r1", "r1", "r2", "r2"];
    let revision_of: BTreeMap<String, &str> = pods.iter().map(|p| p.name.clone()).zip(revs).collect();
    // No rollout: every pod serves, as before, and no per-revision series appears.
    let gw = start(port, rolled(&pods, &["", "", "", ""], None)).await;
    assert_eq!(ask(&gw, "hello", false).await.0, 200);
    assert!(
        !gw.metrics().contains("modelfleet_gateway_revision_"),
        "{}",
        gw.metrics()
    );

    gw.publish(vec![rolled(&pods, &revs, Some((50, 0)))]);
    let mut canary = 0;
    for i in 0..40 {
        let prompt = format!("conversation {i}: you are a helpful assistant");
        let (s1, first, _) = ask(&gw, &prompt, false).await;
        let (s2, again, _) = ask(&gw, &prompt, false).await;
        assert_eq!((s1, s2), (200, 200));
        assert_eq!(
            revision_of[&first], revision_of[&again],
            "{prompt} changed revision"
        );
        canary += usize::from(revision_of[&first] == "r2");
    }
    assert!(
        (8..=32).contains(&canary),
        "{canary} of 40 conversations on the canary at 50%"
    );
    assert_eq!(routed(&gw, "r2", "weight"), 2 * canary as u64);
    assert_eq!(
        revision_requests(&gw, "r1", "ok", "false"),
        80 - 2 * canary as u64
    );
    let ttft = gw
        .gw
        .metrics
        .revisions
        .ttft
        .with_label_values(&["ns", "chat", "r2"]);
    assert_eq!(ttft.get_sample_count(), 2 * canary as u64);

    for (weight, want) in [(100, "r2"), (0, "r1")] {
        gw.publish(vec![rolled(&pods, &revs, Some((weight, 0)))]);
        for i in 0..10 {
            let (_, pod, _) = ask(&gw, &format!("weight {weight} conversation {i}"), false).await;
            assert_eq!(revision_of[&pod], want, "weight {weight}");
        }
    }
}

#[tokio::test]
async fn retries_stay_within_the_revision_then_fall_back() {
    let (pods, port) = pods(3).await;
    let revs = ["r1", "r2", "r2"];
    let gw = start(port, rolled(&pods, &revs, Some((100, 0)))).await;
    pods[1].set(Mode::Status(503, "draining"));
    for i in 0..6 {
        let (status, pod, _) = ask(&gw, &format!("retry {i}"), false).await;
        assert_eq!(
            (status, pod.as_str()),
            (200, "fleet-pod-2"),
            "the other canary pod"
        );
    }
    assert_eq!(
        pods[0].hits(),
        0,
        "stable took a canary request while the canary had a pod"
    );
    // Neither canary pod takes it: the request falls back to stable.
    pods[2].set(Mode::Status(503, "draining"));
    let (status, pod, _) = ask(&gw, "both canary pods refuse", false).await;
    assert_eq!((status, pod.as_str()), (200, "fleet-pod-0"));
    assert_eq!(routed(&gw, "r1", "fallback"), 1);
    assert!(revision_requests(&gw, "r2", "error", "false") >= 2);
    // A canary without Ready pods: stable serves, counted as a fallback.
    gw.publish(vec![rolled(&pods[..1], &revs[..1], Some((100, 0)))]);
    let (status, pod, _) = ask(&gw, "no canary pod", true).await;
    assert_eq!((status, pod.as_str()), (200, "fleet-pod-0"));
    assert_eq!(routed(&gw, "r1", "fallback"), 2);
    let itl = gw
        .gw
        .metrics
        .revisions
        .itl
        .with_label_values(&["ns", "chat", "r1"]);
    assert_eq!(itl.get_sample_count(), 1, "two data events, one gap");
}

#[tokio::test]
async fn a_failing_or_slow_mirror_never_changes_the_clients_answer() {
    let (pods, port) = pods(2).await;
    let gw = start(port, rolled(&pods, &["r1", "r2"], Some((0, 100)))).await;
    pods[1].set(Mode::Status(500, "boom"));
    let (status, pod, body) = ask(&gw, "mirrored json", false).await;
    assert_eq!((status, pod.as_str()), (200, "fleet-pod-0"));
    assert_eq!(body, r#"{"pod":"fleet-pod-0"}"#);
    let (status, pod, body) = ask(&gw, "mirrored stream", true).await;
    assert_eq!((status, pod.as_str()), (200, "fleet-pod-0"));
    assert!(
        body.ends_with("data: [DONE]\n\n") && !body.contains("error"),
        "{body}"
    );
    wait_for("two judged copies", || {
        revision_requests(&gw, "r2", "error", "true") == 2
    })
    .await;
    assert_eq!(pods[1].hits(), 2);
    assert_eq!(
        pods[1].last_auth.lock().unwrap().as_deref(),
        Some("Bearer sk-caller-1"),
        "the copy carries the caller's headers"
    );
    assert_eq!(revision_requests(&gw, "r1", "ok", "false"), 2);
    // Copies are not the client's requests: only the two real ones are accounted for.
    let text = gw.metrics();
    let accounted: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("modelfleet_gateway_requests_total{"))
        .collect();
    assert_eq!(accounted.len(), 1, "{accounted:?}");
    assert!(
        accounted[0].contains("pod=\"fleet-pod-0\"") && accounted[0].ends_with(" 2"),
        "{accounted:?}"
    );

    // A canary that holds its copies for 10 s does not hold the client's answer.
    pods[1].set(Mode::Slow);
    let started = Instant::now();
    let (status, pod, _) = ask(&gw, "slow mirror", false).await;
    assert_eq!((status, pod.as_str()), (200, "fleet-pod-0"));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    wait_for("the slow copy to arrive", || pods[1].hits() == 3).await;
}
