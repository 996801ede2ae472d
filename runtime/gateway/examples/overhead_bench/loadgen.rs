//! The benchmark's load generator: `clients` closed-loop clients, each with its own reqwest client
//! (hyper 1 underneath, HTTP/1.1, one keep-alive connection, `TCP_NODELAY`), sending the same POST
//! again as soon as the previous answer's last byte arrived. A phase warms up (connections opened,
//! caches warm), then measures for a fixed time.
//!
//! What counts: a request's latency is send → last body byte, kept when it started inside the measured
//! window and finished before its end; throughput is the answers completed inside the window divided
//! by its length. Any answer other than 200 with the expected body is an error (the table shows them;
//! the benchmark fails if there is one). [`cpu_ns`] reads the CPU time of a runtime's threads, so a phase
//! can be charged its gateway's and upstream's CPU per request, which the other agents' load on the
//! machine does not inflate the way it inflates wall-clock latency.

use bytes::Bytes;
use std::time::Duration;
use tokio::time::Instant;

/// One phase's outcome.
pub struct Phase {
    /// Latencies in microseconds, sorted.
    pub latencies_us: Vec<u64>,
    /// Answers completed inside the window.
    pub completed: usize,
    /// Failed requests (any time in the phase).
    pub errors: usize,
    /// Answers in the whole phase, warm-up included (for CPU time per request).
    pub all: usize,
    /// The window, seconds.
    pub seconds: f64,
}

impl Phase {
    /// Nearest-rank percentile `q` (0–1) in milliseconds.
    pub fn pct_ms(&self, q: f64) -> f64 {
        let v = &self.latencies_us;
        if v.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1] as f64 / 1000.0
    }

    /// Answers per second.
    pub fn rps(&self) -> f64 {
        self.completed as f64 / self.seconds
    }
}

/// A client for one virtual user: its own pool, so its own connection.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client")
}

/// Sends one request and reads the whole answer: `Some(body)` for a 200.
pub async fn once(client: &reqwest::Client, url: &str, key: &str, body: &Bytes) -> Option<Bytes> {
    let resp = client
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .ok()?;
    if resp.status() != reqwest::StatusCode::OK {
        return None;
    }
    resp.bytes().await.ok()
}

/// Runs one phase against `url`; every answer must equal `expect`.
pub async fn phase(
    url: &str,
    key: &str,
    body: Bytes,
    expect: Bytes,
    clients: usize,
    warmup: Duration,
    measure: Duration,
) -> Phase {
    let t0 = Instant::now() + warmup;
    let end = t0 + measure;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (url, key, body, expect) = (url.to_string(), key.to_string(), body.clone(), expect.clone());
        tasks.spawn(async move {
            let client = client();
            let (mut lat, mut completed, mut errors, mut all) = (Vec::new(), 0usize, 0usize, 0usize);
            loop {
                let start = Instant::now();
                if start >= end {
                    break;
                }
                let ok = once(&client, &url, &key, &body)
                    .await
                    .is_some_and(|b| b == expect);
                let done = Instant::now();
                if !ok {
                    errors += 1;
                    continue;
                }
                all += 1;
                if done >= t0 && done <= end {
                    completed += 1;
                    if start >= t0 {
                        lat.push((done - start).as_micros() as u64);
                    }
                }
            }
            (lat, completed, errors, all)
        });
    }
    let mut out = Phase {
        latencies_us: Vec::new(),
        completed: 0,
        errors: 0,
        all: 0,
        seconds: measure.as_secs_f64(),
    };
    while let Some(r) = tasks.join_next().await {
        let (lat, completed, errors, all) = r.expect("a client task");
        out.latencies_us.extend(lat);
        out.completed += completed;
        out.errors += errors;
        out.all += all;
    }
    out.latencies_us.sort_unstable();
    out
}

/// CPU time so far, in nanoseconds, of this process's threads whose name starts with `prefix` (the
/// first field of `/proc/self/task/*/schedstat`; 0 where the kernel does not provide it).
pub fn cpu_ns(prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix)))
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}
