//! Per-pod load as routing sees it: the requests this gateway has in flight to the pod, and the pod's
//! own `modelfleet_requests_waiting` + `modelfleet_requests_running` and KV-cache usage scraped from its
//! `/metrics` on the admin port (the port and credential the operator's Direct metrics use: no token)
//! at least once a second. A pod that refuses connections is ejected for a few seconds.
//!
//! `load = max(in flight here, waiting + running) × (1 + KV usage)`: the scraped count covers other
//! gateway replicas' requests and direct clients, the local count covers the scrape's lag (the two
//! overlap, hence the max), and KV pressure makes a pod near preemption look busier.
//!
//! Invariants: an in-flight count is raised only by an [`InflightGuard`] and lowered by its drop, so it
//! returns to zero whatever way a request ends; a scrape older than three intervals is ignored; a
//! page whose metrics are missing is not taken as "idle".

use crate::metrics::Metrics;
use modelfleet_api::exposition::samples_of;
use modelfleet_api::metric_names::{KV_CACHE_USAGE_RATIO, REQUESTS_RUNNING, REQUESTS_WAITING};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long a pod that refused a connection stays out of the rotation (unless a scrape or a request
/// succeeds first, or it is the last pod).
pub const EJECT_FOR: Duration = Duration::from_secs(5);
/// Largest `/metrics` page read from a pod.
pub const MAX_SCRAPE_BYTES: usize = 4 << 20;

/// What one scrape of a pod said.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scraped {
    /// Requests waiting.
    pub waiting: f64,
    /// Requests running.
    pub running: f64,
    /// KV-cache usage, 0–1.
    pub kv: f64,
}

#[derive(Default)]
struct PodLoad {
    inflight: AtomicU64,
    scraped: Mutex<Option<(Scraped, Instant)>>,
    ejected_until: Mutex<Option<Instant>>,
}

/// Every pod's load, by pod name.
pub struct LoadTable {
    pods: RwLock<HashMap<String, Arc<PodLoad>>>,
    /// Scrapes older than this are ignored.
    freshness: Duration,
    metrics: Arc<Metrics>,
}

/// One request in flight to a pod; dropping it ends the count.
pub struct InflightGuard {
    pod: Arc<PodLoad>,
    name: String,
    metrics: Arc<Metrics>,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let left = self.pod.inflight.fetch_sub(1, Ordering::SeqCst) - 1;
        self.metrics
            .inflight
            .with_label_values(&[&self.name])
            .set(left as i64);
    }
}

impl LoadTable {
    /// An empty table; scrapes count for three `scrape_interval`s.
    pub fn new(scrape_interval: Duration, metrics: Arc<Metrics>) -> LoadTable {
        LoadTable {
            pods: RwLock::default(),
            freshness: scrape_interval * 3,
            metrics,
        }
    }

    fn pod(&self, name: &str) -> Arc<PodLoad> {
        if let Some(p) = self.pods.read().unwrap().get(name) {
            return p.clone();
        }
        self.pods
            .write()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// Counts a request in flight to `pod` until the guard drops.
    pub fn start(&self, pod: &str) -> InflightGuard {
        let p = self.pod(pod);
        let now = p.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        self.metrics.inflight.with_label_values(&[pod]).set(now as i64);
        InflightGuard {
            pod: p,
            name: pod.to_string(),
            metrics: self.metrics.clone(),
        }
    }

    /// Requests this gateway has in flight to `pod`.
    pub fn inflight(&self, pod: &str) -> u64 {
        self.pods
            .read()
            .unwrap()
            .get(pod)
            .map_or(0, |p| p.inflight.load(Ordering::SeqCst))
    }

    /// The routing load of `pod` (see the module header).
    pub fn load(&self, pod: &str) -> f64 {
        let Some(p) = self.pods.read().unwrap().get(pod).cloned() else {
            return 0.0;
        };
        let inflight = p.inflight.load(Ordering::SeqCst) as f64;
        match *p.scraped.lock().unwrap() {
            Some((s, at)) if at.elapsed() < self.freshness => {
                inflight.max(s.waiting + s.running) * (1.0 + s.kv.clamp(0.0, 1.0))
            }
            _ => inflight,
        }
    }

    /// Records a scrape of `pod`; a pod that answers is back in the rotation.
    pub fn scraped(&self, pod: &str, s: Scraped) {
        let p = self.pod(pod);
        *p.scraped.lock().unwrap() = Some((s, Instant::now()));
        *p.ejected_until.lock().unwrap() = None;
    }

    /// Takes `pod` out of the rotation for [`EJECT_FOR`] (it refused a connection).
    pub fn eject(&self, pod: &str) {
        *self.pod(pod).ejected_until.lock().unwrap() = Some(Instant::now() + EJECT_FOR);
    }

    /// Puts `pod` back (a request to it succeeded).
    pub fn restore(&self, pod: &str) {
        if let Some(p) = self.pods.read().unwrap().get(pod) {
            *p.ejected_until.lock().unwrap() = None;
        }
    }

    /// Whether `pod` is ejected now.
    pub fn ejected(&self, pod: &str) -> bool {
        self.pods.read().unwrap().get(pod).is_some_and(|p| {
            p.ejected_until
                .lock()
                .unwrap()
                .is_some_and(|t| t > Instant::now())
        })
    }

    /// Forgets pods not in `live` with nothing in flight (and their gauge).
    pub fn retain(&self, live: &std::collections::HashSet<&str>) {
        let mut pods = self.pods.write().unwrap();
        pods.retain(|name, p| {
            let keep = live.contains(name.as_str()) || p.inflight.load(Ordering::SeqCst) > 0;
            if !keep {
                let _ = self.metrics.inflight.remove_label_values(&[name]);
            }
            keep
        });
    }
}

/// Reads the three load figures from a runtime pod's `/metrics` page.
pub fn parse_load(text: &str) -> Result<Scraped, String> {
    let mut figures = [None::<f64>; 3];
    for (i, name) in [REQUESTS_WAITING, REQUESTS_RUNNING, KV_CACHE_USAGE_RATIO]
        .into_iter()
        .enumerate()
    {
        for s in samples_of(text, name) {
            let v = s?.value;
            figures[i] = Some(match figures[i] {
                None => v,
                Some(prev) if i == 2 => prev.max(v),
                Some(prev) => prev + v,
            });
        }
    }
    match figures {
        [Some(waiting), Some(running), Some(kv)] => Ok(Scraped { waiting, running, kv }),
        _ => Err(format!(
            "missing {REQUESTS_WAITING}, {REQUESTS_RUNNING} or {KV_CACHE_USAGE_RATIO}"
        )),
    }
}

/// Scrapes one pod: the figures, or whether the connection itself failed (`Err(true)`).
pub async fn scrape(
    client: &reqwest::Client,
    ip: &str,
    port: u16,
    timeout: Duration,
) -> Result<Scraped, bool> {
    let url = format!("http://{ip}:{port}/metrics");
    let mut resp = match client.get(&url).timeout(timeout).send().await {
        Ok(r) if r.status().is_success() => r,
        Ok(_) => return Err(false),
        Err(e) => return Err(e.is_connect()),
    };
    let mut page = Vec::new();
    loop {
        match tokio::time::timeout(timeout, resp.chunk()).await {
            Ok(Ok(Some(c))) if page.len() + c.len() <= MAX_SCRAPE_BYTES => page.extend_from_slice(&c),
            Ok(Ok(None)) => break,
            _ => return Err(false),
        }
    }
    parse_load(&String::from_utf8_lossy(&page)).map_err(|_| false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> LoadTable {
        LoadTable::new(Duration::from_secs(1), Arc::new(Metrics::new()))
    }

    #[test]
    fn inflight_guards_count_and_uncount() {
        let t = table();
        let a = t.start("p");
        let b = t.start("p");
        assert_eq!((t.inflight("p"), t.load("p")), (2, 2.0));
        drop(a);
        assert_eq!(t.inflight("p"), 1);
        drop(b);
        assert_eq!(t.inflight("p"), 0);
        assert_eq!(t.load("unknown"), 0.0);
    }

    #[test]
    fn load_combines_scrapes_without_double_counting() {
        let t = table();
        let _g = t.start("p");
        t.scraped(
            "p",
            Scraped {
                waiting: 3.0,
                running: 2.0,
                kv: 0.5,
            },
        );
        assert_eq!(t.load("p"), 5.0 * 1.5);
        t.scraped(
            "p",
            Scraped {
                waiting: 0.0,
                running: 0.0,
                kv: 0.0,
            },
        );
        assert_eq!(
            t.load("p"),
            1.0,
            "our own request is in flight even if the scrape missed it"
        );
    }

    #[test]
    fn ejection_and_restore() {
        let t = table();
        t.eject("p");
        assert!(t.ejected("p"));
        t.restore("p");
        assert!(!t.ejected("p"));
        t.eject("p");
        t.scraped(
            "p",
            Scraped {
                waiting: 0.0,
                running: 0.0,
                kv: 0.0,
            },
        );
        assert!(!t.ejected("p"));
    }

    #[test]
    fn parses_a_runtime_page() {
        let page = "# TYPE modelfleet_requests_waiting gauge\n\
                    modelfleet_requests_waiting{model=\"m\",tenant=\"a\"} 2\n\
                    modelfleet_requests_waiting{model=\"m\",tenant=\"b\"} 1\n\
                    modelfleet_requests_running{model=\"m\"} 4\n\
                    modelfleet_kv_cache_usage_ratio{model=\"m\"} 0.25\n\
                    modelfleet_requests_waiting_total 99\n";
        assert_eq!(
            parse_load(page).unwrap(),
            Scraped {
                waiting: 3.0,
                running: 4.0,
                kv: 0.25
            }
        );
        assert!(parse_load("modelfleet_requests_waiting 1\n").is_err());
        assert!(parse_load("modelfleet_requests_waiting x\n").is_err());
    }
}
