//! What the analysis judges: each revision's traffic as the fleet gateway counts it, summed over the
//! gateway's pods, read on every pass, and its increase over the running step's window.
//!
//! The gateway exports, per (namespace, model_deployment, revision): answered requests by outcome
//! (`ok` / `error`, real and mirrored alike), and the time-to-first-token and inter-token-latency
//! histograms (docs/gateway.md, "Canary routing"). Increases follow Prometheus' `increase` per
//! gateway pod; a pod whose counters went down restarted, and its new value is the increase.
//!
//! Invariants: a reading exists only when every Ready gateway pod answered; the window never reaches
//! back before the step began (a step is judged on its own traffic only); history lives in the
//! leader's memory (a new leader waits one window before judging).

use super::analysis::Traffic;
use modelfleet_api::exposition::samples_of;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use modelfleet_api::metric_names::{
    GATEWAY_REVISION_ITL as REVISION_ITL, GATEWAY_REVISION_REQUESTS as REVISION_REQUESTS,
    GATEWAY_REVISION_TTFT as REVISION_TTFT,
};

/// Cumulative traffic per revision on one gateway pod (or summed over several).
pub type PerRevision = BTreeMap<String, Traffic>;

/// Reads one gateway pod's page for `ns/md`.
pub fn parse(page: &str, ns: &str, md: &str) -> Result<PerRevision, String> {
    let mut out = PerRevision::new();
    let ours = |s: &modelfleet_api::exposition::Sample| {
        s.label("namespace") == Some(ns) && s.label("model_deployment") == Some(md)
    };
    for s in samples_of(page, REVISION_REQUESTS) {
        let s = s?;
        let (Some(rev), true) = (s.label("revision"), ours(&s)) else {
            continue;
        };
        let t = out.entry(rev.to_string()).or_default();
        t.requests += s.value;
        if s.label("outcome") == Some("error") {
            t.errors += s.value;
        }
    }
    for (name, itl) in [(REVISION_TTFT, false), (REVISION_ITL, true)] {
        let bucket = format!("{name}_bucket");
        for s in samples_of(page, &bucket) {
            let s = s?;
            let (Some(rev), Some(le), true) = (s.label("revision"), s.label("le"), ours(&s)) else {
                continue;
            };
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().map_err(|_| format!("bad le {le:?}"))?
            };
            let t = out.entry(rev.to_string()).or_default();
            if itl { &mut t.itl } else { &mut t.ttft }.add(le, s.value);
        }
    }
    Ok(out)
}

fn sum(into: &mut Traffic, t: &Traffic) {
    into.requests += t.requests;
    into.errors += t.errors;
    into.ttft.merge(&t.ttft);
    into.itl.merge(&t.itl);
}

/// `newer − older` per pod (a restarted pod: `newer`).
fn increase(newer: &Traffic, older: &Traffic) -> Traffic {
    if newer.requests < older.requests || newer.errors < older.errors {
        return newer.clone();
    }
    Traffic {
        requests: newer.requests - older.requests,
        errors: newer.errors - older.errors,
        ttft: newer.ttft.since(&older.ttft),
        itl: newer.itl.since(&older.itl),
    }
}

/// One reading: per gateway pod, per revision.
type Reading = BTreeMap<String, PerRevision>;

/// Readings of one deployment, oldest first.
type Readings = VecDeque<(Instant, Reading)>;

/// The leader's per-deployment history of readings.
#[derive(Clone, Default)]
pub struct History {
    inner: Arc<Mutex<HashMap<(String, String), Readings>>>,
    /// Stable's last window with enough requests to judge against, per deployment.
    baselines: Arc<Mutex<HashMap<(String, String), Traffic>>>,
}

impl History {
    /// Records a reading of `ns/md` (keeping `keep` of history).
    pub fn push(&self, ns: &str, md: &str, at: Instant, reading: Reading, keep: Duration) {
        let mut all = self.inner.lock().unwrap();
        let q = all.entry((ns.into(), md.into())).or_default();
        q.push_back((at, reading));
        while q.front().is_some_and(|(t, _)| at.duration_since(*t) > keep) {
            q.pop_front();
        }
    }

    /// Forgets `ns/md` (deleted, or no rollout running).
    pub fn forget(&self, ns: &str, md: &str) {
        let key = (ns.to_string(), md.to_string());
        self.inner.lock().unwrap().remove(&key);
        self.baselines.lock().unwrap().remove(&key);
    }

    /// Stable's traffic to judge against: `now` when it holds at least `min` requests (it becomes the
    /// baseline), else the last baseline (`None` without one).
    pub fn stable(&self, ns: &str, md: &str, now: Traffic, min: f64) -> Option<Traffic> {
        let key = (ns.to_string(), md.to_string());
        let mut b = self.baselines.lock().unwrap();
        if now.requests >= min {
            b.insert(key, now.clone());
            return Some(now);
        }
        b.get(&key).cloned()
    }

    /// Each revision's traffic between the oldest reading no earlier than `since` and the newest;
    /// `None` without two such readings.
    pub fn window(&self, ns: &str, md: &str, since: Instant) -> Option<PerRevision> {
        let all = self.inner.lock().unwrap();
        let q = all.get(&(ns.to_string(), md.to_string()))?;
        let (t1, newest) = q.back()?;
        let (t0, oldest) = q.iter().find(|(t, _)| *t >= since)?;
        if t0 == t1 {
            return None;
        }
        let mut out = PerRevision::new();
        for (pod, revisions) in newest {
            for (rev, now) in revisions {
                let before = oldest
                    .get(pod)
                    .and_then(|r| r.get(rev))
                    .cloned()
                    .unwrap_or_default();
                sum(out.entry(rev.clone()).or_default(), &increase(now, &before));
            }
        }
        Some(out)
    }
}

/// Reads every Ready gateway pod's page for `ns/md`; fails if any fails.
pub async fn read(
    client: &reqwest::Client,
    ips: &[String],
    port: u16,
    ns: &str,
    md: &str,
) -> Result<Reading, String> {
    let pages = crate::autoscaler::gateway::read_each(client, ips, port, |t| parse(t, ns, md)).await?;
    Ok(pages.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
modelfleet_gateway_revision_requests_total{namespace=\"a\",model_deployment=\"chat\",revision=\"r1\",outcome=\"ok\",mirrored=\"false\"} 90
modelfleet_gateway_revision_requests_total{namespace=\"a\",model_deployment=\"chat\",revision=\"r2\",outcome=\"ok\",mirrored=\"false\"} 8
modelfleet_gateway_revision_requests_total{namespace=\"a\",model_deployment=\"chat\",revision=\"r2\",outcome=\"error\",mirrored=\"true\"} 2
modelfleet_gateway_revision_requests_total{namespace=\"b\",model_deployment=\"chat\",revision=\"r2\",outcome=\"error\",mirrored=\"false\"} 50
modelfleet_gateway_revision_ttft_seconds_bucket{namespace=\"a\",model_deployment=\"chat\",revision=\"r2\",le=\"0.1\"} 6
modelfleet_gateway_revision_ttft_seconds_bucket{namespace=\"a\",model_deployment=\"chat\",revision=\"r2\",le=\"+Inf\"} 8
modelfleet_gateway_revision_itl_seconds_bucket{namespace=\"a\",model_deployment=\"chat\",revision=\"r2\",le=\"+Inf\"} 40
";

    #[test]
    fn a_page_reads_per_revision_for_one_deployment() {
        let r = parse(PAGE, "a", "chat").unwrap();
        assert_eq!((r["r1"].requests, r["r1"].errors), (90.0, 0.0));
        assert_eq!((r["r2"].requests, r["r2"].errors), (10.0, 2.0));
        assert_eq!(r["r2"].ttft.0, [(0.1, 6.0), (f64::INFINITY, 8.0)]);
        assert_eq!(r["r2"].itl.count(), 40.0);
        assert!(parse(PAGE, "c", "chat").unwrap().is_empty());
    }

    #[test]
    fn stable_falls_back_to_its_last_window_with_enough_requests() {
        let h = History::default();
        let n = |requests: f64| Traffic {
            requests,
            ..Default::default()
        };
        assert_eq!(h.stable("a", "chat", n(10.0), 50.0), None);
        assert_eq!(h.stable("a", "chat", n(500.0), 50.0), Some(n(500.0)));
        // A step at 100 % leaves stable a few fallbacks: the baseline stands in.
        assert_eq!(h.stable("a", "chat", n(16.0), 50.0), Some(n(500.0)));
        h.forget("a", "chat");
        assert_eq!(h.stable("a", "chat", n(16.0), 50.0), None);
    }

    #[test]
    fn the_window_is_the_increase_since_the_step_began_across_a_gateway_restart() {
        let h = History::default();
        let t0 = Instant::now();
        let reading = |g1: f64, g2: f64| {
            let one = |n: f64| {
                PerRevision::from([(
                    "r2".to_string(),
                    Traffic {
                        requests: n,
                        ..Default::default()
                    },
                )])
            };
            Reading::from([("g1".to_string(), one(g1)), ("g2".to_string(), one(g2))])
        };
        let keep = Duration::from_secs(600);
        h.push("a", "chat", t0, reading(100.0, 50.0), keep);
        assert!(h.window("a", "chat", t0).is_none(), "one reading is no window");
        h.push(
            "a",
            "chat",
            t0 + Duration::from_secs(10),
            reading(110.0, 55.0),
            keep,
        );
        h.push(
            "a",
            "chat",
            t0 + Duration::from_secs(20),
            reading(130.0, 5.0),
            keep,
        );
        // g1: +30; g2 restarted: its 5 count.
        assert_eq!(h.window("a", "chat", t0).unwrap()["r2"].requests, 35.0);
        // From the step that began at +5 s: the reading at +10 s is the base (g1 +20, g2's 5).
        assert_eq!(
            h.window("a", "chat", t0 + Duration::from_secs(5)).unwrap()["r2"].requests,
            25.0
        );
        assert!(h.window("a", "chat", t0 + Duration::from_secs(30)).is_none());
    }
}
