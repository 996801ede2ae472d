//! Latency objectives and schedule windows on the local cluster (`docs/autoscaling.md`).
//!
//! - A schedule window that opens two minutes into the scenario with `minReplicas: 3` has 3 Ready
//!   replicas when it opens, not after; when it closes the fleet returns to what the objectives need
//!   (idle: 1); a night window with `maxReplicas: 0` lets the deployment rest at zero, and a request
//!   through the gateway still wakes it.
//! - The objectives autoscaler on a ramp of arrivals (low, rising to about three replicas' worth,
//!   holding, falling; Poisson, seeded) scales out for the peak and back without failing a request;
//!   with `MF_E2E_RAMP_COMPARE=1` (a benchmark: docs/benchmarks.md) today's queue/KV autoscaler with
//!   its default targets runs the same ramp first, and the share of requests over each objective and the
//!   replica-seconds of each are printed side by side. Each replica is held to half a CPU (a CPU limit), so a replica is a
//!   fixed amount of capacity, as a GPU would be, rather than a share of the two cores all replicas sit on.
//!
//! Run by `make e2e`; nothing is mocked.

mod common;
use common::fleet::*;
use common::ramp;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use modelfleet_crds::ModelDeployment;
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

/// The scenarios share two CPU cores and the operator: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A ModelDeployment of `model` (directory, digest) served as `served`, with `runtime` and `autoscaling`
/// (YAML lines indented 4).
fn deployment(
    name: &str,
    model: &(PathBuf, String),
    served: &str,
    runtime: &str,
    autoscaling: &str,
) -> String {
    let (dir, digest) = model;
    format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: {name}\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {served}\n  runtime:\n    threads: 1\n{runtime}  \
         autoscaling:\n    mode: Builtin\n{autoscaling}",
        dir.display()
    )
}

/// `status.desiredReplicas`, `status.readyReplicas`.
async fn counts(mds: &Api<ModelDeployment>, name: &str) -> Option<(i32, i32)> {
    let st = mds.get(name).await.ok()?.status?;
    Some((st.desired_replicas?, st.ready_replicas))
}

async fn set_schedule(mds: &Api<ModelDeployment>, name: &str, schedule: serde_json::Value) {
    mds.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"autoscaling": {"schedule": schedule}}})),
    )
    .await
    .unwrap();
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn a_schedule_window_is_ready_when_it_opens_and_a_night_window_rests_at_zero() {
    let _serial = SERIAL.lock().await;
    ensure_operator().await;
    let ns = TestNamespace::new("sched");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let served = format!("sched-{}", ns.name);
    let autoscaling = "    minReplicas: 1\n    maxReplicas: 3\n    objectives:\n      ttftP95: 1s\n    \
                       scaleDownStabilizationSeconds: 10\n    scaleToZeroAfterSeconds: 10\n";
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&deployment(
            "sched",
            &tiny_model(&ns.name),
            &served,
            "",
            autoscaling,
        )),
    );
    wait_until("1 Ready replica", Duration::from_secs(120), || async {
        (counts(&mds, "sched").await? == (1, 1)).then_some(())
    })
    .await;

    // A window opening at the first whole minute at least 2 minutes from now (UTC), for 1 minute.
    let now = Timestamp::now().as_second();
    let open_at = (now + 120 + 59) / 60 * 60;
    let civil = Timestamp::from_second(open_at)
        .unwrap()
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
    let start = format!("{} {} * * *", civil.minute(), civil.hour());
    set_schedule(
        &mds,
        "sched",
        json!([{"name": "rush", "start": start, "duration": "1m", "minReplicas": 3}]),
    )
    .await;
    eprintln!("window `{start}` (UTC) opens in {} s", open_at - now);
    let mut three_ready_at = None;
    while Timestamp::now().as_second() < open_at {
        if three_ready_at.is_none() && counts(&mds, "sched").await.is_some_and(|(_, r)| r >= 3) {
            three_ready_at = Some(Timestamp::now());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (desired, ready) = counts(&mds, "sched").await.unwrap();
    let at = three_ready_at.unwrap_or_else(|| {
        panic!(
            "the window opened with {ready} Ready replicas of {desired} desired (3 wanted before it opened)"
        )
    });
    let md = mds.get("sched").await.unwrap();
    let st = md.status.unwrap();
    let rise = st
        .recent_decisions
        .iter()
        .rev()
        .find(|d| d.to == 3)
        .expect("a decision to 3");
    eprintln!(
        "3 Ready {} s before the window opened; the rise was decided {} s before: {}",
        open_at - at.as_second(),
        open_at - rise.time.0.as_second(),
        rise.reason
    );
    let windows = st.objectives.map(|o| o.schedule_windows).unwrap_or_default();
    assert_eq!(windows, ["rush"], "status.objectives.scheduleWindows");

    // Open: the count holds at 3 until the window closes; then idle needs 1 (down window 10 s).
    let close_at = open_at + 60;
    while Timestamp::now().as_second() < close_at - 2 {
        let (desired, _) = counts(&mds, "sched").await.unwrap();
        assert_eq!(desired, 3, "the count while the window is open");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    wait_until("back to 1 after the window", Duration::from_secs(90), || async {
        (counts(&mds, "sched").await? == (1, 1)).then_some(())
    })
    .await;
    eprintln!(
        "back to 1 replica {} s after the window closed",
        Timestamp::now().as_second() - close_at
    );

    // A night window open all the time with maxReplicas 0: idle for 10 s, it rests at zero.
    set_schedule(
        &mds,
        "sched",
        json!([{"name": "night", "start": "* * * * *", "duration": "1h", "maxReplicas": 0}]),
    )
    .await;
    let at_zero = || async {
        let (desired, _) = counts(&mds, "sched").await?;
        (desired == 0 && pod_count(&pods, "sched").await == 0).then_some(())
    };
    wait_until(
        "rest at zero in the night window",
        Duration::from_secs(90),
        at_zero,
    )
    .await;
    // A request through the gateway wakes one replica and is answered.
    let (status, _, body) = chat(&gateway(Duration::from_secs(180)), None, &served, "wake up", 4)
        .await
        .expect("the gateway answers");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        counts(&mds, "sched").await.map(|c| c.0),
        Some(1),
        "woken to 1, not more"
    );
    wait_until("back to rest at zero", Duration::from_secs(90), at_zero).await;
}

/// A SmolLM2-135M-shaped model (random weights, f16) under the cluster's artifacts directory, and its
/// digest: real per-token work, so a replica serves about a request per second, not hundreds.
fn smollm2_shaped_model() -> (PathBuf, String) {
    let dir = cluster_dir().join("artifacts/ramp-smollm2-f16");
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.to_str().unwrap();
    runtime(&[
        "gen-model",
        path,
        "--shape",
        "smollm2-135m",
        "--seed",
        "11",
        "--dtype",
        "f16",
    ]);
    let digest = runtime(&["digest", path]).trim().to_string();
    (dir, digest)
}

/// Tokens per request of the ramp.
const RAMP_TOKENS: u32 = 64;
/// The objectives of the ramp's objectives mode, seconds.
const TTFT_OBJECTIVE: f64 = 1.0;
const ITL_OBJECTIVE: f64 = 0.2;
/// Each ramp replica: half a CPU, up to 8 sequences at once.
const RAMP_RUNTIME: &str = "    maxNumSeqs: 8\n    resources:\n      limits:\n        cpu: 500m\n";
/// Bounds and windows both modes share.
const RAMP_BOUNDS: &str = "    minReplicas: 1\n    maxReplicas: 4\n    scaleUpStabilizationSeconds: 15\n    \
                           scaleDownStabilizationSeconds: 30\n";

/// Requests/s one replica completes with 12 streams in flight (8 running, 4 waiting) for 20 s: its
/// saturated capacity, which the autoscaler measures meanwhile too.
async fn one_replica_capacity(served: &str) -> f64 {
    let start = std::time::Instant::now();
    let http = gateway(Duration::from_secs(60));
    let streams = (0..12).map(|k| {
        let (served, http) = (served.to_string(), http.clone());
        tokio::spawn(async move {
            let (mut done, mut i) = (0, 1_000_000 + k * 10_000);
            while start.elapsed() < Duration::from_secs(20) {
                if ramp::stream_once(&http, &served, i, RAMP_TOKENS).await.is_ok() {
                    done += 1;
                }
                i += 1;
            }
            done
        })
    });
    let done: usize = futures::future::join_all(streams)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .sum();
    done as f64 / start.elapsed().as_secs_f64()
}

/// The ramp in multiples of one replica's capacity `c`: 30 s low, a 60 s rise to 2.2c (three
/// replicas at 73%), 60 s there, a 30 s fall, 60 s low.
fn ramp_shape(c: f64) -> ramp::Shape {
    vec![
        (0.0, 0.3 * c),
        (30.0, 0.3 * c),
        (90.0, 2.2 * c),
        (150.0, 2.2 * c),
        (180.0, 0.3 * c),
        (240.0, 0.3 * c),
    ]
}

/// One mode's run: what the requests saw and the replicas it used.
struct RampRun {
    observed: Vec<ramp::Observed>,
    replicas: ramp::Replicas,
}

impl RampRun {
    fn report(&self, mode: &str) -> (f64, f64, f64) {
        let all: Vec<&ramp::Observed> = self.observed.iter().collect();
        let after: Vec<&ramp::Observed> = match self.replicas.first_scale_up {
            Some(t) => all.iter().copied().filter(|o| o.sent >= t).collect(),
            None => Vec::new(),
        };
        let failed = all.iter().filter(|o| o.error.is_some()).count();
        let ttft = |xs: &[&ramp::Observed]| ramp::share_over(xs, |o| o.ttft, TTFT_OBJECTIVE);
        let itl = |xs: &[&ramp::Observed]| ramp::share_over(xs, |o| o.itl, ITL_OBJECTIVE);
        eprintln!(
            "[{mode}] {} requests, {failed} failed; over TTFT {TTFT_OBJECTIVE} s: {:.1}% (after the first scale-up, \
             {:.0} s in: {:.1}%); over ITL {ITL_OBJECTIVE} s: {:.1}% ({:.1}%); replica-seconds {:.0}, most replicas {}",
            all.len(),
            100.0 * ttft(&all),
            self.replicas.first_scale_up.unwrap_or(f64::NAN),
            100.0 * ttft(&after),
            100.0 * itl(&all),
            100.0 * itl(&after),
            self.replicas.seconds,
            self.replicas.most
        );
        if let Some(e) = all.iter().find_map(|o| o.error.clone()) {
            eprintln!("[{mode}] first failure: {e}");
        }
        (
            ttft(&all).max(itl(&all)),
            ttft(&after).max(itl(&after)),
            failed as f64 / all.len() as f64,
        )
    }
}

/// Runs the ramp against a fresh deployment with `autoscaling`; measures the shape first if none is given.
async fn ramp_mode(
    mode: &str,
    model: &(PathBuf, String),
    autoscaling: &str,
    shape: Option<ramp::Shape>,
) -> (RampRun, ramp::Shape) {
    let ns = TestNamespace::new(&format!("ramp-{mode}"));
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let served = format!("ramp-{}", ns.name);
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&deployment("ramp", model, &served, RAMP_RUNTIME, autoscaling)),
    );
    wait_until("1 Ready replica", Duration::from_secs(120), || async {
        (counts(&mds, "ramp").await? == (1, 1)).then_some(())
    })
    .await;
    // Both modes measure one replica saturated first (a fleet that has run before knows its
    // replicas' throughput); the first run's figure shapes both ramps.
    let c = one_replica_capacity(&served).await;
    eprintln!("[{mode}] one replica (half a CPU) completes {c:.2} requests/s of {RAMP_TOKENS} tokens");
    let shape = shape.unwrap_or_else(|| ramp_shape(c));
    // The ramp starts from one replica with the measurement out of the objectives' window (30 s):
    // the saturating streams' queueing must not count as the ramp's.
    tokio::time::sleep(Duration::from_secs(35)).await;
    wait_until("back to 1 replica", Duration::from_secs(120), || async {
        (counts(&mds, "ramp").await? == (1, 1) && pod_count(&pods, "ramp").await == 1).then_some(())
    })
    .await;
    let started = k8s_openapi::jiff::Timestamp::now();
    let meter = ramp::ReplicaMeter::start(pods.clone(), mds.clone(), "ramp");
    let observed = ramp::run(&served, &shape, 0x5107, RAMP_TOKENS).await;
    let replicas = meter.stop();
    if autoscaling.contains("objectives") {
        let st = mds.get("ramp").await.unwrap().status.unwrap();
        let o = st.objectives.expect("status.objectives");
        eprintln!("[{mode}] status.objectives: {o:?}");
        assert!(
            o.ttft_p95.is_some_and(|s| s.ends_with("/ 1.00s")),
            "TTFT against its objective"
        );
        dashboard_queries_return_data("modelfleet-autoscaling.json", 5).await;
    }
    let decisions = mds.get("ramp").await.unwrap().status.unwrap().recent_decisions;
    for d in decisions {
        let at = d.time.0.as_second() - started.as_second();
        eprintln!("[{mode}] {at:+} s: {} -> {}: {}", d.from, d.to, d.reason);
    }
    (RampRun { observed, replicas }, shape)
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn objectives_and_queue_targets_side_by_side_on_one_ramp() {
    let _serial = SERIAL.lock().await;
    ensure_operator().await;
    let model = smollm2_shaped_model();
    let objectives = format!(
        "{RAMP_BOUNDS}    objectives:\n      ttftP95: {}ms\n      itlP95: {}ms\n      windowSeconds: 30\n",
        TTFT_OBJECTIVE * 1e3,
        ITL_OBJECTIVE * 1e3
    );
    // The comparison is a benchmark (docs/benchmarks.md): the queue/KV run before the objectives one
    // doubles the scenario's 6 minutes, so `make e2e` runs the objectives mode alone.
    let compare = std::env::var("MF_E2E_RAMP_COMPARE").is_ok_and(|v| v == "1");
    let queue = match compare {
        true => Some(ramp_mode("queue", &model, RAMP_BOUNDS, None).await),
        false => None,
    };
    let shape = queue.as_ref().map(|(_, shape)| shape.clone());
    let (slo, _) = ramp_mode("objectives", &model, &objectives, shape).await;
    let (s_all, _, s_failed) = slo.report("objectives");
    let mut runs = vec![("objectives", &slo, s_failed)];
    if let Some((queue, _)) = &queue {
        let (q_all, _, q_failed) = queue.report("queue/KV defaults");
        eprintln!(
            "objectives vs queue/KV: violations {:.1}% vs {:.1}%, replica-seconds {:.2}x",
            100.0 * s_all,
            100.0 * q_all,
            slo.replicas.seconds / queue.replicas.seconds
        );
        runs.push(("queue", queue, q_failed));
    }
    // What holds on a shared two-core machine every run (the bars of the issue are reported, not
    // asserted: see the closing note): each mode scales out for the peak and back, nothing fails.
    for (mode, run, failed) in runs {
        assert!(run.replicas.most >= 2, "[{mode}] scaled out for the peak");
        assert!(
            failed <= 0.01,
            "[{mode}] {:.1}% of requests failed",
            100.0 * failed
        );
    }
}
