//! Canary rollouts on the local cluster, end to end: a ModelDeployment with `spec.rollout: Canary`
//! under steady load from many tenants through the fleet gateway.
//! - A good revision (a changed runtime setting) walks 10 % → 50 % → 100 %, judged on the gateway's
//!   per-revision figures; the share of requests the canary's pods answered in each step is measured
//!   against the step's weight; every request is answered; at the end only the new revision runs and
//!   `status.rollout.steps` holds each step's figures.
//! - A bad revision (its pods fail 30 % of requests: `--fault-error-percent`) is rolled back by itself
//!   during its first step: `Progressing=False/RolledBack`, the failed threshold and figures in
//!   status, stable serving throughout, the failed requests counted against weight × window.
//! - A slow revision (300 ms before each request) in a shadow step: clients only get stable's answers
//!   while it receives copies, and it is rolled back on its p95 time to first token.
//!
//! The figures are printed. Run by `make e2e`; nothing is mocked.

mod common;
use common::fleet::{chat, condition, gateway, served_by, tiny_model};
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use modelfleet_crds::ModelDeployment;
use modelfleet_crds::rollout::{REVISION_LABEL, RolloutPhase, RolloutStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TENANTS: usize = 16;
const SERVED: &str = "roll-chat";

fn key(t: usize) -> String {
    format!("sk-roll-tenant-{t}")
}

fn secret() -> String {
    let mut s = String::from(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: roll-keys\nstringData:\n  tenants.yaml: |\n    tenants:\n",
    );
    for t in 0..TENANTS {
        s.push_str(&format!(
            "    - id: tenant-{t}\n      apiKeys: [\"{}\"]\n",
            key(t)
        ));
    }
    s
}

/// The ModelDeployment; `extra` is appended to `spec.runtime` (what makes a new revision), `mirror`
/// to `spec.rollout`.
fn manifest(dir: &std::path::Path, digest: &str, extra: &str, mirror: &str) -> String {
    format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: roll\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {SERVED}\n  replicas: 2\n  runtime:\n    \
         threads: 1\n{extra}  autoscaling:\n    mode: Disabled\n  tenants:\n    secretRef:\n      name: roll-keys\n  \
         rollout:\n    strategy: Canary\n    steps:\n    - {{weight: 10, pause: 60s}}\n    - {{weight: 50, pause: 60s}}\n    \
         - {{weight: 100, pause: 20s}}\n    analysis:\n      windowSeconds: 30\n      minRequests: 40\n      \
         maxTtftP95Ratio: \"3\"\n      maxItlP95Ratio: \"3\"\n{mirror}",
        dir.display()
    )
}

/// One answered (or failed) request: when it was sent, its status (0: no answer) and the pod.
struct Answer {
    at: Instant,
    status: u16,
    pod: String,
}

/// Sends requests from every tenant, 6 at a time, distinct prompts, until `stop`.
fn load(stop: Arc<AtomicBool>) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Vec<Answer>>>) {
    let answers = Arc::new(Mutex::new(Vec::new()));
    let out = answers.clone();
    let task = tokio::spawn(async move {
        let http = gateway(Duration::from_secs(60));
        let workers = (0..6).map(|w| {
            let (http, stop, out) = (http.clone(), stop.clone(), out.clone());
            async move {
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let at = Instant::now();
                    let prompt = format!("conversation {i}: tell me about the number {}", i * 7919 % 10007);
                    // One worker streams, so the inter-token latency is judged too.
                    let answer = match w {
                        0 => streamed(&http, &key(i % TENANTS), &prompt).await,
                        _ => chat(&http, Some(&key(i % TENANTS)), SERVED, &prompt, 4)
                            .await
                            .map(|(s, pod, _)| (s, pod)),
                    };
                    let (status, pod) = answer.unwrap_or((0, String::new()));
                    out.lock().unwrap().push(Answer { at, status, pod });
                    i += 6;
                }
            }
        });
        futures::future::join_all(workers).await;
    });
    (task, answers)
}

/// A streamed chat completion of 8 tokens, read to its end: (status, pod); a broken stream is 0.
async fn streamed(http: &reqwest::Client, key: &str, prompt: &str) -> Result<(u16, String), String> {
    let r = http
        .post(format!("{}/v1/chat/completions", gateway_url()))
        .bearer_auth(key)
        .json(
            &serde_json::json!({"model": SERVED, "stream": true, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": prompt}]}),
        )
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let (status, pod) = (r.status().as_u16(), served_by(&r));
    let text = r.text().await.map_err(|e| e.to_string())?;
    let complete = status != 200 || text.contains("data: [DONE]");
    Ok((if complete { status } else { 0 }, pod))
}

/// Records `status.rollout` once a second until `done` holds; returns (when, rollout) pairs.
async fn follow(
    mds: &Api<ModelDeployment>,
    limit: Duration,
    done: impl Fn(&RolloutStatus) -> bool,
) -> Vec<(Instant, RolloutStatus)> {
    let start = Instant::now();
    let mut seen: Vec<(Instant, RolloutStatus)> = Vec::new();
    loop {
        if let Some(r) = mds.get("roll").await.ok().and_then(|m| m.status?.rollout) {
            let changed = seen
                .last()
                .is_none_or(|(_, p)| (p.phase, p.weight, p.step) != (r.phase, r.weight, r.step));
            if changed {
                eprintln!(
                    "[rollout] {:?} weight {} step {:?}: {}",
                    r.phase, r.weight, r.step, r.message
                );
            }
            let finished = done(&r);
            seen.push((Instant::now(), r));
            if finished {
                return seen;
            }
        }
        assert!(
            start.elapsed() < limit,
            "the rollout did not finish in {limit:?}: {:?}",
            seen.last()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The weight in force at `at` (the last status read before it), when the phase had traffic steps.
fn weight_at(track: &[(Instant, RolloutStatus)], at: Instant) -> Option<i32> {
    let (_, r) = track.iter().rev().find(|(t, _)| *t <= at)?;
    matches!(r.phase, RolloutPhase::Progressing | RolloutPhase::Paused).then_some(r.weight)
}

async fn revisions_running(pods: &Api<Pod>) -> Vec<String> {
    let lp = ListParams::default().labels("app.kubernetes.io/instance=roll");
    let mut revs: Vec<String> = pods
        .list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.metadata.labels.as_ref()?.get(REVISION_LABEL).cloned())
        .collect();
    revs.sort();
    revs.dedup();
    revs
}

/// The scenario's objects.
struct Scene {
    ns: TestNamespace,
    mds: Api<ModelDeployment>,
    pods: Api<Pod>,
    deployments: Api<Deployment>,
    dir: std::path::PathBuf,
    digest: String,
}

impl Scene {
    fn apply(&self, extra: &str, mirror: &str) {
        let m = manifest(&self.dir, &self.digest, extra, mirror);
        kubectl_ok(&["apply", "-n", &self.ns.name, "-f", "-"], Some(&m));
    }

    async fn rollout(&self) -> RolloutStatus {
        self.mds
            .get("roll")
            .await
            .unwrap()
            .status
            .unwrap()
            .rollout
            .unwrap()
    }

    async fn canary_gone(&self, what: &str) {
        wait_until(what, Duration::from_secs(90), || async {
            self.deployments
                .get_opt("roll-canary")
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
    }
}

/// Runs `apply` under load until the rollout ends as `done` says; the track and the answers.
async fn under_load(
    scene: &Scene,
    apply: impl FnOnce(),
    limit: Duration,
    done: impl Fn(&RolloutStatus) -> bool,
) -> (Vec<(Instant, RolloutStatus)>, Vec<Answer>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (task, answers) = load(stop.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    apply();
    let track = follow(&scene.mds, limit, done).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    task.await.unwrap();
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    (track, answers)
}

const GOOD: &str = "    env:\n    - name: MODELFLEET_DRILL\n      value: good\n";

/// A good revision walks every step; each step's measured split is within 3 points of its weight.
async fn a_good_canary_promotes(scene: &Scene, first: &str) -> String {
    let (track, answers) = under_load(
        scene,
        || scene.apply(GOOD, ""),
        Duration::from_secs(480),
        |r| r.phase == RolloutPhase::Stable && r.stable_revision != first,
    )
    .await;
    let done = &track.last().unwrap().1;
    let failed = answers.iter().filter(|a| a.status != 200).count();
    eprintln!(
        "[rollout] good canary: {} requests, {failed} not answered 200",
        answers.len()
    );
    assert_eq!(failed, 0, "every request is answered during a good rollout");
    for weight in [10, 50] {
        let in_step: Vec<&Answer> = answers
            .iter()
            .filter(|a| weight_at(&track, a.at) == Some(weight))
            .collect();
        let canary = in_step
            .iter()
            .filter(|a| a.pod.starts_with("roll-canary-"))
            .count();
        let share = 100.0 * canary as f64 / in_step.len().max(1) as f64;
        eprintln!(
            "[rollout] step {weight}%: {canary} of {} requests on the canary = {share:.1}%",
            in_step.len()
        );
        assert!(
            in_step.len() >= 400,
            "at least 400 requests in the {weight}% step, got {}",
            in_step.len()
        );
        assert!(
            (share - f64::from(weight)).abs() <= 3.0,
            "the {weight}% step sent {share:.1}% to the canary"
        );
    }
    for s in &done.steps {
        eprintln!(
            "[rollout]   step at {}%: canary {} requests ({}% errors), stable {} ({}%), TTFT p95 ratio {:?}, ITL p95 ratio {:?}",
            s.weight,
            s.canary_requests,
            s.canary_error_percent,
            s.stable_requests,
            s.stable_error_percent,
            s.ttft_p95_ratio,
            s.itl_p95_ratio
        );
    }
    let judged: Vec<(i32, &str)> = done
        .steps
        .iter()
        .map(|s| (s.weight, s.verdict.as_str()))
        .collect();
    assert_eq!(
        judged,
        [(10, "Passed"), (50, "Passed"), (100, "Passed")],
        "{:?}",
        done.steps
    );
    let second = done.stable_revision.clone();
    scene
        .canary_gone("the canary Deployment gone after promotion")
        .await;
    wait_until("only the new revision runs", Duration::from_secs(120), || async {
        (revisions_running(&scene.pods).await == [second.clone()]).then_some(())
    })
    .await;
    second
}

/// A revision whose pods fail 30 % of requests is rolled back during its first step.
async fn a_bad_canary_rolls_back(scene: &Scene, stable: &str) -> String {
    let bad =
        format!("{GOOD}    extraArgs: [\"--enable-fault-injection\", \"--fault-error-percent\", \"30\"]\n");
    let (track, answers) = under_load(
        scene,
        || scene.apply(&bad, ""),
        Duration::from_secs(300),
        |r| r.phase == RolloutPhase::RolledBack,
    )
    .await;
    let traffic_started = track.iter().find(|(_, r)| r.weight > 0).map(|(t, _)| *t);
    let (rolled_back, r) = track.last().unwrap().clone();
    let failed = answers.iter().filter(|a| a.status != 200).count();
    let exposed = traffic_started.map_or(Duration::ZERO, |t| rolled_back.duration_since(t));
    eprintln!(
        "[rollout] bad canary rolled back {exposed:?} after traffic reached it: {}; {failed} of {} requests failed",
        r.message,
        answers.len()
    );
    assert_eq!(r.stable_revision, stable, "stable stays the good revision");
    assert!(
        r.message.contains("error rate"),
        "the failed threshold is named: {}",
        r.message
    );
    let last = r.steps.last().expect("the failed step's figures");
    assert_eq!((last.verdict.as_str(), last.weight), ("Failed", 10), "{last:?}");
    assert!(
        exposed <= Duration::from_secs(30),
        "rolled back within one analysis window: {exposed:?}"
    );
    // Bound: the canary's share (10 %) of the requests sent while it had traffic, at its 30 % failure
    // rate (twice, for chance), plus the few in flight as the weight went back to 0.
    let while_exposed = answers
        .iter()
        .filter(|a| {
            traffic_started.is_some_and(|t| a.at >= t) && a.at <= rolled_back + Duration::from_secs(2)
        })
        .count();
    let bound = (while_exposed as f64 * 0.10 * 0.30 * 2.0).ceil() as usize + 6;
    eprintln!("[rollout] failed requests: {failed}, bound {bound} ({while_exposed} sent while exposed)");
    assert!(
        failed <= bound,
        "{failed} failed requests, more than the bound {bound}"
    );
    let md = scene.mds.get("roll").await.unwrap();
    assert_eq!(
        condition(&md, "Progressing"),
        Some(("False".into(), "RolledBack".into()))
    );
    scene
        .canary_gone("the canary Deployment deleted after the rollback")
        .await;
    // Stable serves on, and the rolled-back revision is not retried.
    let http = gateway(Duration::from_secs(30));
    for i in 0..10 {
        let (s, _, body) = chat(&http, Some(&key(i)), SERVED, "after the rollback", 4)
            .await
            .unwrap();
        assert_eq!(s, 200, "{body}");
    }
    assert_eq!(scene.rollout().await.phase, RolloutPhase::RolledBack);
    r.canary_revision.expect("the rolled-back revision")
}

/// A slow revision (300 ms before each request is scheduled) in a shadow step: clients only ever get
/// stable's answers while it receives copies, and it is rolled back on its p95 time to first token.
async fn a_slow_canary_fails_in_its_shadow_step(scene: &Scene, bad: &str) {
    let slow =
        format!("{GOOD}    extraArgs: [\"--enable-fault-injection\", \"--fault-delay-ms\", \"300\"]\n");
    let mirror = "    mirror: {percent: 50, pause: 60s}\n";
    let counts = tokio::spawn(shadow_counts(
        scene.mds.clone(),
        scene.pods.clone(),
        scene.ns.name.clone(),
    ));
    let (track, answers) = under_load(
        scene,
        || scene.apply(&slow, mirror),
        Duration::from_secs(300),
        |r| r.phase == RolloutPhase::RolledBack && r.canary_revision.as_deref() != Some(bad),
    )
    .await;
    let r = track.last().unwrap().1.clone();
    assert!(
        track.iter().all(|(_, r)| r.weight == 0),
        "the shadow step never gives the canary clients"
    );
    assert!(
        track.iter().any(|(_, r)| r.phase == RolloutPhase::Mirroring),
        "a shadow step ran"
    );
    let on_canary = answers
        .iter()
        .filter(|a| a.pod.starts_with("roll-canary-"))
        .count();
    let failed = answers.iter().filter(|a| a.status != 200).count();
    eprintln!(
        "[rollout] slow canary in shadow: {}; {} requests, {failed} failed, {on_canary} answered by the canary",
        r.message,
        answers.len()
    );
    assert_eq!((on_canary, failed), (0, 0), "clients get only stable's answers");
    assert!(
        r.message.contains("time to first token"),
        "rolled back on latency: {}",
        r.message
    );
    let last = r.steps.last().unwrap();
    assert_eq!(
        (
            last.step,
            last.verdict.as_str(),
            last.canary_error_percent.as_str()
        ),
        (-1, "Failed", "0.00"),
        "{last:?}"
    );
    assert!(last.canary_requests >= 40, "the copies were judged: {last:?}");
    // What the gateway sent the canary as copies is what the canary's pods counted.
    let (sent, counted) = counts
        .await
        .unwrap()
        .expect("counters read during the shadow step");
    eprintln!("[rollout] shadow step: the gateway sent {sent} copies, the canary's pods counted {counted}");
    assert!(
        sent >= 1.0 && (sent - counted).abs() <= 64.0 + 0.05 * sent,
        "{sent} sent, {counted} counted"
    );
    // The gateway counted the copies the canary received as mirrored.
    let page = gateway_metrics().await;
    let mirrored = page.lines().any(|l| {
        l.starts_with("modelfleet_gateway_revision_requests_total")
            && l.contains(&format!("namespace=\"{}\"", scene.ns.name))
            && l.contains("mirrored=\"true\"")
    });
    assert!(mirrored, "mirrored copies are counted per revision");
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn a_good_canary_promotes_and_bad_or_slow_ones_roll_back_by_themselves() {
    ensure_operator().await;
    let ns = TestNamespace::new("rollout");
    let client = client().await;
    let (dir, digest) = tiny_model(&ns.name);
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&secret()));
    let scene = Scene {
        mds: Api::namespaced(client.clone(), &ns.name),
        pods: Api::namespaced(client.clone(), &ns.name),
        deployments: Api::namespaced(client.clone(), &ns.name),
        ns,
        dir,
        digest,
    };
    scene.apply("", "");
    let first = wait_until(
        "the first revision Ready and stable",
        Duration::from_secs(240),
        || async {
            let md = scene.mds.get("roll").await.ok()?;
            let ready = condition(&md, "Ready")?.0 == "True";
            let r = md.status?.rollout?;
            (ready && r.phase == RolloutPhase::Stable && md_ready_pods(&scene.pods).await >= 2)
                .then_some(r.stable_revision)
        },
    )
    .await;
    let second = a_good_canary_promotes(&scene, &first).await;
    let bad = a_bad_canary_rolls_back(&scene, &second).await;
    a_slow_canary_fails_in_its_shadow_step(&scene, &bad).await;
    // The rollouts dashboard plots both revisions' split, errors and latencies.
    dashboard_queries_return_data("modelfleet-rollouts.json", 4).await;
}

/// During the shadow step: the copies the gateway's pages count for the canary revision, and the
/// requests the canary's Ready pods count on their own `/metrics` (read together, a few seconds in).
async fn shadow_counts(mds: Api<ModelDeployment>, pods: Api<Pod>, ns: String) -> Option<(f64, f64)> {
    let start = Instant::now();
    let canary = loop {
        let r = mds.get("roll").await.ok()?.status?.rollout?;
        if r.phase == RolloutPhase::Mirroring {
            break r.canary_revision?;
        }
        if start.elapsed() > Duration::from_secs(240) {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sum = |page: &str, name: &str, want: &[&str]| -> f64 {
        page.lines()
            .filter(|l| l.starts_with(name) && want.iter().all(|w| l.contains(w)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let lp = ListParams::default().labels("app.kubernetes.io/instance=roll,modelfleet.io/track=canary");
    let canary_pods: Vec<String> = pods
        .list(&lp)
        .await
        .ok()?
        .items
        .iter()
        .filter(|p| is_ready(p))
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    let mut counted = 0.0;
    for ip in &canary_pods {
        let page = http()
            .get(format!("http://{ip}:8001/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        counted += sum(&page, "modelfleet_requests_total", &[]);
    }
    let page = gateway_metrics().await;
    let (ns_label, rev_label) = (format!("namespace=\"{ns}\""), format!("revision=\"{canary}\""));
    let sent = sum(
        &page,
        "modelfleet_gateway_revision_requests_total",
        &[&ns_label, &rev_label, "mirrored=\"true\""],
    );
    Some((sent, counted))
}

async fn md_ready_pods(pods: &Api<Pod>) -> usize {
    let lp = ListParams::default().labels("app.kubernetes.io/instance=roll");
    pods.list(&lp)
        .await
        .map(|l| l.items.iter().filter(|p| is_ready(p)).count())
        .unwrap_or(0)
}
