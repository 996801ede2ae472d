//! A soak with faults: minutes of mixed load on one `serve` — chat and completions, streaming and
//! not, `n` > 1, base and two LoRA adapters, two tenants (one of them quota-limited), deadlines, clients
//! that drop mid-stream or give up before the answer, a tenants file rewritten every few seconds with a
//! rotating key. Afterwards the pool holds no blocks for anybody (`modelfleet_kv_cache_usage_ratio` 0,
//! nothing running or waiting), resident memory is within 10% of its level after the warm-up, and every
//! request got either a well-formed answer or one of the documented errors.
//!
//! `MODELFLEET_SOAK_SECONDS` sets the soak's length (default 180).

mod common;

use common::metric_sum as metric;
use modelfleet_runtime::gen_adapter::gen_adapter;
use rand::{Rng, RngExt, SeedableRng};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ADMIN: &str = "admin-secret";
const WORKERS: usize = 8;

fn tenants_file(generation: u64) -> String {
    // team-a and team-b keep their keys; team-b's second key rotates with every rewrite, and a third
    // tenant comes and goes.
    let extra = if generation.is_multiple_of(2) {
        "- id: team-c\n  apiKeys: [\"sk-team-c\"]\n"
    } else {
        ""
    };
    format!(
        "tenants:\n- id: team-a\n  apiKeys: [\"sk-team-a\"]\n- id: team-b\n  apiKeys: [\"sk-team-b\", \"sk-team-b-rot-{generation}\"]\n  \
         maxConcurrentRequests: 6\n{extra}"
    )
}

fn setup(dir: &Path) -> Vec<String> {
    std::fs::write(dir.join("tenants.yaml"), tenants_file(0)).unwrap();
    std::fs::write(dir.join("admin-token"), ADMIN).unwrap();
    for (name, seed) in [("a1", 1), ("a2", 2)] {
        gen_adapter(&dir.join("adapters").join(name), &dir.join("tiny"), 8, seed, &[]).unwrap();
    }
    vec![
        "--tenants".into(),
        dir.join("tenants.yaml").display().to_string(),
        "--admin-token-file".into(),
        dir.join("admin-token").display().to_string(),
        "--adapter-file-roots".into(),
        dir.join("adapters").display().to_string(),
        "--max-num-seqs".into(),
        "8".into(),
        "--max-num-queued-reqs".into(),
        "48".into(),
        "--num-kv-blocks".into(),
        "512".into(),
    ]
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// What a request ended as: `Ok` kinds are answers, the rest documented errors; `Bad` fails the test.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Ok(&'static str),
    Expected(String),
    ClientGaveUp,
    Bad(String),
}

/// Documented refusals and what may cause them here.
fn expected_status(status: u16) -> bool {
    // 401: a rotated key in the window between a rewrite and its reload; 404: team-b naming a1 (not its
    // adapter); 429: queue or quota; 504: a deadline before the first token.
    matches!(status, 401 | 404 | 429 | 504)
}

fn check_error_body(status: u16, v: &Value) -> Outcome {
    let e = &v["error"];
    if !(e["message"].is_string() && e["type"].is_string()) {
        return Outcome::Bad(format!("{status} without an OpenAI error body: {v}"));
    }
    if expected_status(status) {
        Outcome::Expected(format!(
            "{status} {}",
            e["code"].as_str().unwrap_or(e["type"].as_str().unwrap())
        ))
    } else {
        Outcome::Bad(format!("unexpected {status}: {v}"))
    }
}

fn check_choices(v: &Value, want: usize) -> Outcome {
    let Some(choices) = v["choices"].as_array() else {
        return Outcome::Bad(format!("no choices: {v}"));
    };
    if choices.len() != want || v["usage"]["completion_tokens"].as_u64().is_none() {
        return Outcome::Bad(format!(
            "{} choices, want {want}, or no usage: {v}",
            choices.len()
        ));
    }
    for c in choices {
        let r = c["finish_reason"].as_str().unwrap_or("");
        if !["stop", "length", "timeout"].contains(&r) {
            return Outcome::Bad(format!("finish_reason {r:?}: {v}"));
        }
    }
    Outcome::Ok("json")
}

/// Reads an SSE stream to its end (or drops it after `drop_after` events).
async fn read_stream(mut r: reqwest::Response, drop_after: Option<usize>) -> Outcome {
    let mut buf = String::new();
    let mut events = 0;
    loop {
        match r.chunk().await {
            Ok(Some(bytes)) => buf.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(None) => break,
            Err(e) => return Outcome::Bad(format!("stream broke: {e}")),
        }
        while let Some(i) = buf.find("\n\n") {
            let event: String = buf.drain(..i + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                return Outcome::Bad(format!("not an SSE data event: {event:?}"));
            };
            if data == "[DONE]" {
                return Outcome::Ok("stream");
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                return Outcome::Bad(format!("not JSON: {data}"));
            };
            if v.get("error").is_some() {
                // A failure after the start is an error event, then [DONE]; here only deadlines.
                let msg = v["error"]["type"].as_str().unwrap_or("").to_string();
                if msg != "timeout_error" {
                    return Outcome::Bad(format!("error event: {v}"));
                }
            }
            events += 1;
            if drop_after.is_some_and(|d| events >= d) {
                return Outcome::ClientGaveUp; // dropping `r` closes the connection mid-stream
            }
        }
    }
    Outcome::Bad(format!("the stream ended without [DONE]; left: {buf:?}"))
}

async fn one(c: &reqwest::Client, base: &str, rng: &mut impl Rng, generation: u64) -> Outcome {
    let chat = rng.random_bool(0.5);
    let stream = rng.random_bool(0.5);
    let n = [1, 1, 2, 3][rng.random_range(0..4)];
    let model = ["tiny", "tiny", "a1", "a2"][rng.random_range(0..4)];
    let key = match rng.random_range(0..10) {
        0..=4 => "sk-team-a".to_string(),
        5..=8 => "sk-team-b".to_string(),
        _ => format!("sk-team-b-rot-{generation}"),
    };
    let max_tokens = rng.random_range(1..48);
    let mut body = if chat {
        json!({"model": model, "messages": [{"role": "user", "content": format!("tell me {}", rng.random_range(0..1000))}]})
    } else {
        json!({"model": model, "prompt": format!("once upon a time {}", rng.random_range(0..1000))})
    };
    body["max_tokens"] = max_tokens.into();
    body["n"] = n.into();
    body["stream"] = stream.into();
    body["temperature"] = [0.0, 0.8][rng.random_range(0..2)].into();
    if rng.random_bool(0.1) {
        body["timeout"] = 0.05.into(); // a deadline that often passes
    }
    if rng.random_bool(0.2) {
        body["cache_salt"] = format!("salt-{}", rng.random_range(0..3)).into();
    }
    let path = if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let give_up_early = !stream && rng.random_bool(0.1);
    let mut req = c.post(format!("{base}{path}")).bearer_auth(&key).json(&body);
    if give_up_early {
        req = req.timeout(Duration::from_millis(rng.random_range(5..60)));
    }
    let r = match req.send().await {
        Ok(r) => r,
        Err(e) if give_up_early && e.is_timeout() => return Outcome::ClientGaveUp,
        Err(e) => return Outcome::Bad(format!("transport: {e}")),
    };
    let status = r.status().as_u16();
    if status == 200 && stream {
        let drop_after = rng.random_bool(0.25).then(|| rng.random_range(1..4));
        return read_stream(r, drop_after).await;
    }
    let v: Value = match r.json().await {
        Ok(v) => v,
        Err(e) if give_up_early && e.is_timeout() => return Outcome::ClientGaveUp,
        Err(e) => return Outcome::Bad(format!("{status}: body is not JSON: {e}")),
    };
    if status == 200 {
        check_choices(&v, n)
    } else {
        check_error_body(status, &v)
    }
}

/// Drives `WORKERS` clients for `secs`; returns every outcome.
async fn load(base: &str, secs: u64, seed: u64, generation: &Arc<Mutex<u64>>) -> Vec<Outcome> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (c, base, generation) = (c.clone(), base.to_string(), generation.clone());
            tokio::spawn(async move {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed * 100 + w as u64);
                let mut out = Vec::new();
                while Instant::now() < until {
                    let g = *generation.lock().unwrap();
                    out.push(one(&c, &base, &mut rng, g).await);
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

async fn metrics(admin_base: &str) -> String {
    reqwest::get(format!("{admin_base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Waits until nothing runs or waits and no block is held; returns the metrics then.
async fn settle(admin_base: &str) -> String {
    let t0 = Instant::now();
    loop {
        let m = metrics(admin_base).await;
        let busy = metric(&m, "modelfleet_requests_running")
            + metric(&m, "modelfleet_requests_waiting")
            + metric(&m, "modelfleet_kv_cache_usage_ratio");
        if busy == 0.0 {
            return m;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the server never settled: running {} waiting {} kv {}",
            metric(&m, "modelfleet_requests_running"),
            metric(&m, "modelfleet_requests_waiting"),
            metric(&m, "modelfleet_kv_cache_usage_ratio")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn minutes_of_mixed_load_with_faults_leak_nothing() {
    let secs: u64 = std::env::var("MODELFLEET_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(180);
    let s = common::start(&[], setup);
    let admin_base = s.admin_base();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = reqwest::Client::new();
    for (name, tenants) in [("a1", json!(["team-a"])), ("a2", json!([]))] {
        let path = s.dir.path().join("adapters").join(name);
        let digest = modelfleet_runtime::digest::digest_path(&path).unwrap();
        let r = c
            .post(format!("{admin_base}/v1/adapters"))
            .bearer_auth(ADMIN)
            .json(&json!({"name": name, "uri": format!("file://{}", path.display()), "digest": digest, "tenants": tenants}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
    }
    let generation = Arc::new(Mutex::new(0u64));
    let base = s.base();
    // Warm-up: every path once and the allocator's working set, then the reference memory.
    let warm = load(&base, 20, 1, &generation).await;
    settle(&admin_base).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let warm_rss = rss_kib(s.pid());
    // The soak, with the tenants file rewritten every 3 s.
    let tenants_path = s.dir.path().join("tenants.yaml");
    let rewriter = {
        let generation = generation.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(3)).await;
                let g = *generation.lock().unwrap() + 1;
                std::fs::write(&tenants_path, tenants_file(g)).unwrap();
                *generation.lock().unwrap() = g;
            }
        })
    };
    let t0 = Instant::now();
    let outcomes = load(&base, secs, 2, &generation).await;
    rewriter.abort();
    let soak_secs = t0.elapsed().as_secs_f64();
    let m = settle(&admin_base).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_rss = rss_kib(s.pid());

    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let mut bad = Vec::new();
    for o in warm.iter().chain(&outcomes) {
        let key = match o {
            Outcome::Ok(k) => format!("ok {k}"),
            Outcome::Expected(k) => format!("expected {k}"),
            Outcome::ClientGaveUp => "client gave up".into(),
            Outcome::Bad(why) => {
                bad.push(why.clone());
                "BAD".into()
            }
        };
        *tally.entry(key).or_default() += 1;
    }
    let cached = metric(&m, "modelfleet_kv_cache_cached_blocks");
    println!(
        "soak: {} requests in {soak_secs:.0} s (+{} in the warm-up): {tally:?}; kv usage {} running {} waiting {}, \
         {cached} evictable cached blocks; RSS {warm_rss} KiB after warm-up, {after_rss} KiB after the soak",
        outcomes.len(),
        warm.len(),
        metric(&m, "modelfleet_kv_cache_usage_ratio"),
        metric(&m, "modelfleet_requests_running"),
        metric(&m, "modelfleet_requests_waiting"),
    );
    assert!(
        bad.is_empty(),
        "{} malformed or unexpected answers, e.g. {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert!(outcomes.len() > 100, "the soak ran: {} requests", outcomes.len());
    assert!(
        tally.contains_key("ok stream")
            && tally.contains_key("ok json")
            && tally.contains_key("client gave up")
    );
    assert!(
        after_rss * 10 <= warm_rss * 11,
        "resident memory grew from {warm_rss} KiB to {after_rss} KiB"
    );
    // And the server still serves.
    let r = c
        .post(format!("{base}/v1/completions"))
        .bearer_auth("sk-team-a")
        .json(&json!({"model": "a2", "prompt": "the end", "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}
