//! An open-loop load with a shape: Poisson arrivals whose rate follows a piecewise-linear ramp (fixed
//! seed, so every run sends the same requests at the same offsets), each a streamed chat completion
//! through the gateway whose time to first token and gaps between tokens are recorded; and the
//! replica-seconds a ModelDeployment used meanwhile, from its pods.

use super::fleet::{error_chain, gateway, pod_count};
use super::gateway_url;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use modelfleet_crds::ModelDeployment;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// (seconds from the start, requests/s), linear in between.
pub type Shape = Vec<(f64, f64)>;

/// One request as the client saw it.
#[derive(Clone, Debug)]
pub struct Observed {
    /// Seconds from the start of the load to its arrival.
    pub sent: f64,
    /// Arrival to the first token, seconds; `None` if it failed.
    pub ttft: Option<f64>,
    /// Mean gap between tokens, seconds (the request's inter-token latency).
    pub itl: Option<f64>,
    /// Why it failed.
    pub error: Option<String>,
}

/// The rate at `t` seconds.
fn rate_at(shape: &Shape, t: f64) -> f64 {
    for w in shape.windows(2) {
        let ((t0, r0), (t1, r1)) = (w[0], w[1]);
        if t >= t0 && t <= t1 {
            return r0 + (r1 - r0) * (t - t0) / (t1 - t0).max(1e-9);
        }
    }
    0.0
}

/// Arrival offsets (seconds) of a Poisson process with the shape's rate (thinning, seeded).
pub fn arrivals(shape: &Shape, seed: u64) -> Vec<f64> {
    let peak = shape.iter().map(|p| p.1).fold(0.0, f64::max);
    let end = shape.last().map_or(0.0, |p| p.0);
    let mut state = seed;
    let mut uniform = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        t += -(1.0 - uniform()).ln() / peak;
        if t >= end {
            return out;
        }
        if uniform() < rate_at(shape, t) / peak {
            out.push(t);
        }
    }
}

/// One streamed chat completion of `max_tokens` tokens: TTFT and mean inter-token gap.
pub async fn stream_once(
    http: &reqwest::Client,
    model: &str,
    i: usize,
    max_tokens: u32,
) -> Result<(f64, f64), String> {
    let start = Instant::now();
    let mut r = http
        .post(format!("{}/v1/chat/completions", gateway_url()))
        .json(&json!({"model": model, "stream": true, "max_tokens": max_tokens, "ignore_eos": true,
            "temperature": 0,
            "messages": [{"role": "user", "content": format!("request {i}: tell me about item {}", i * 7919)}]}))
        .send()
        .await
        .map_err(|e| error_chain(&e))?;
    if r.status() != 200 {
        return Err(format!("HTTP {}", r.status()));
    }
    let mut times = Vec::new();
    let mut carry = String::new();
    while let Some(bytes) = r.chunk().await.map_err(|e| error_chain(&e))? {
        carry.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = carry.find("\n\n") {
            let event: String = carry.drain(..end + 2).collect();
            if event.contains("\"content\":\"") && !event.contains("\"content\":\"\"") {
                times.push(start.elapsed().as_secs_f64());
            }
        }
    }
    let first = *times.first().ok_or("no token in the stream")?;
    let itl = if times.len() > 1 {
        (times[times.len() - 1] - first) / (times.len() - 1) as f64
    } else {
        0.0
    };
    Ok((first, itl))
}

/// Sends the shape's requests to `model` through the gateway and returns what each saw.
pub async fn run(model: &str, shape: &Shape, seed: u64, max_tokens: u32) -> Vec<Observed> {
    let http = gateway(Duration::from_secs(120));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, at) in arrivals(shape, seed).into_iter().enumerate() {
        let due = start + Duration::from_secs_f64(at);
        tokio::time::sleep_until(due.into()).await;
        let (http, model) = (http.clone(), model.to_string());
        tasks.push(tokio::spawn(async move {
            let sent = start.elapsed().as_secs_f64();
            match stream_once(&http, &model, i, max_tokens).await {
                Ok((ttft, itl)) => Observed {
                    sent,
                    ttft: Some(ttft),
                    itl: Some(itl),
                    error: None,
                },
                Err(e) => Observed {
                    sent,
                    ttft: None,
                    itl: None,
                    error: Some(e),
                },
            }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("a request task"));
    }
    out
}

/// What a [`ReplicaMeter`] saw.
#[derive(Clone, Copy, Debug, Default)]
pub struct Replicas {
    /// Σ pods existing × seconds (what the fleet paid for).
    pub seconds: f64,
    /// Seconds from the start until more than one replica was Ready (the first scale-up completed).
    pub first_scale_up: Option<f64>,
    /// The most pods seen at once.
    pub most: usize,
}

/// Samples a ModelDeployment's pods and Ready count once a second until stopped.
pub struct ReplicaMeter {
    state: Arc<Mutex<Replicas>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReplicaMeter {
    /// Starts sampling `name`'s pods.
    pub fn start(pods: Api<Pod>, mds: Api<ModelDeployment>, name: &str) -> ReplicaMeter {
        let state = Arc::new(Mutex::new(Replicas::default()));
        let (s, name) = (state.clone(), name.to_string());
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut last = Instant::now();
            loop {
                let n = pod_count(&pods, &name).await;
                let ready = mds
                    .get(&name)
                    .await
                    .ok()
                    .and_then(|m| m.status)
                    .map(|st| st.ready_replicas);
                {
                    let mut g = s.lock().unwrap();
                    // A list that failed (usize::MAX) does not count its second.
                    if n != usize::MAX {
                        g.seconds += n as f64 * last.elapsed().as_secs_f64();
                        g.most = g.most.max(n);
                    }
                    if ready.is_some_and(|r| r > 1) && g.first_scale_up.is_none() {
                        g.first_scale_up = Some(start.elapsed().as_secs_f64());
                    }
                }
                last = Instant::now();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        ReplicaMeter { state, task }
    }

    /// Stops and returns what it saw.
    pub fn stop(self) -> Replicas {
        self.task.abort();
        *self.state.lock().unwrap()
    }
}

/// Share (0–1) of `xs` over `limit`, counting failures as over.
pub fn share_over(xs: &[&Observed], value: impl Fn(&Observed) -> Option<f64>, limit: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.iter().filter(|o| value(o).is_none_or(|v| v > limit)).count() as f64 / xs.len() as f64
}
