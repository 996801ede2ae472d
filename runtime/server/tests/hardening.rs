//! One caller cannot stall or exhaust a pod: unauthenticated uploads are answered from their headers
//! (401) without the body being read, huge prompts are refused (413) off the async workers while
//! `/health` keeps answering, one tenant's fan-out cannot fill the queue for the others, and a request's
//! `cache_salt` is bounded.

mod common;

use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The measuring tests run alone (write lock); the others share the machine (read).
static TIMING: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn tenants(dir: &Path) -> Vec<String> {
    let p = dir.join("tenants.yaml");
    std::fs::write(
        &p,
        "tenants:\n- id: team-a\n  apiKeys: [\"sk-team-a\"]\n- id: team-b\n  apiKeys: [\"sk-team-b\"]\n",
    )
    .unwrap();
    vec!["--tenants".into(), p.display().to_string()]
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn client() -> reqwest::Client {
    common::client(Duration::from_secs(120))
}

/// Sends `POST path` with a `len`-byte body announced, the first chunk of it, then reads the status
/// line (the server may answer before the body is complete) and sends the rest while it can.
fn upload(port: u16, path: &str, key: &str, len: usize) -> (u16, Duration) {
    let t0 = Instant::now();
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {len}\r\n\r\n"
    );
    c.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b' '; 64 << 10];
    let _ = c.write_all(&chunk);
    let mut buf = [0u8; 64];
    let n = c.read(&mut buf).unwrap_or(0);
    let took = t0.elapsed();
    let status = std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| s.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // The rest of the body, as a careless client would send it; the server has closed by now.
    let mut sent = chunk.len();
    while sent < len && c.write_all(&chunk).is_ok() {
        sent += chunk.len();
    }
    (status, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unauthenticated_uploads_get_401_from_their_headers_and_memory_stays_flat() {
    let _alone = TIMING.write().await;
    let s = common::start(&[], tenants);
    let idle = rss_kib(s.pid());
    let pid = s.pid();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(idle));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let port = s.port;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            tokio::task::spawn_blocking(move || {
                let path = if i % 2 == 0 {
                    "/v1/chat/completions"
                } else {
                    "/v1/completions"
                };
                upload(port, path, "sk-not-a-key", 4 << 20)
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for t in tasks {
        let (status, took) = t.await.unwrap();
        assert_eq!(status, 401, "an unknown key is refused");
        slowest = slowest.max(took);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "200 unauthenticated 4 MiB uploads: RSS idle {idle} KiB, peak {peak} KiB; slowest 401 after {slowest:?}"
    );
    assert!(
        peak < idle + 100 * 1024,
        "resident memory rose from {idle} KiB to {peak} KiB (the bodies were read)"
    );
    assert!(slowest < Duration::from_secs(5), "401s are prompt: {slowest:?}");
}

/// `GET /health` over a fresh connection, timed; on its own thread, so the test's own uploads (4 MB
/// each) never delay the probe on the client side.
fn probe_health(port: u16) -> (u16, Duration) {
    let t0 = Instant::now();
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 64];
    let n = c.read(&mut buf).unwrap_or(0);
    let status = std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| s.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_four_clients_send_4_mb_chat_messages() {
    let _alone = TIMING.write().await;
    let s = common::start(&[], tenants);
    let c = client();
    let big = "lorem ipsum ".repeat((4 << 20) / 12 - 100);
    // Serialized once, before anything is timed: the client's own JSON work is not the server's.
    let body = axum::body::Bytes::from(
        serde_json::to_vec(&json!({"model": "tiny", "messages": [{"role": "user", "content": big}]}))
            .unwrap(),
    );
    let url = format!("{}/v1/chat/completions", s.base());
    let senders: Vec<_> = (0..4)
        .map(|_| {
            let (c, url, body) = (c.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                let r = c
                    .post(url)
                    .bearer_auth("sk-team-a")
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap();
                (status, v)
            })
        })
        .collect();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let port = s.port;
    let prober = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut probes = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) || probes.len() < 20 {
                let (status, took) = probe_health(port);
                assert_eq!(status, 200);
                probes.push(took);
                std::thread::sleep(Duration::from_millis(10));
            }
            probes
        })
    };
    let mut results = Vec::new();
    for t in senders {
        results.push(t.await.unwrap());
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut probes = prober.join().unwrap();
    for (status, v) in results {
        assert_eq!(status, 413, "{v}");
        assert_eq!(v["error"]["param"], "messages", "{v}");
    }
    probes.sort();
    let worst = *probes.last().unwrap();
    println!(
        "/health during 4 MB prompts: {} probes, median {:?}, worst {worst:?}",
        probes.len(),
        probes[probes.len() / 2]
    );
    assert!(worst < Duration::from_millis(100), "/health took {worst:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_fanout_cannot_fill_the_queue_for_another() {
    let _shared = TIMING.read().await;
    // One sequence runs at a time and the queue holds 32; each tenant may have 16 waiting.
    let s = common::start(&["--max-num-seqs", "1", "--max-num-queued-reqs", "32"], tenants);
    let c = client();
    let url = format!("{}/v1/completions", s.base());
    let fan = |key: &'static str, max_tokens: u32| {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let body = json!({"model": "tiny", "prompt": ["a", "b"], "n": 8, "max_tokens": max_tokens,
                "ignore_eos": true, "temperature": 0});
            let r = c.post(url).bearer_auth(key).json(&body).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    // Too wide a fan-out is refused outright, before tokenizing.
    let body = json!({"model": "tiny", "prompt": vec!["x"; 16], "n": 2, "max_tokens": 1});
    let r = c
        .post(&url)
        .bearer_auth("sk-team-a")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "prompt", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("at most 16"),
        "{v}"
    );
    // Team A's long fan-out of 16 sequences: one runs, 15 wait.
    let first = tokio::spawn(fan("sk-team-a", 1500));
    let t0 = Instant::now();
    loop {
        let m = c
            .get(format!("{}/metrics", s.admin_base()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let waiting: f64 = m
            .lines()
            .filter(|l| l.starts_with("modelfleet_requests_waiting{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if waiting >= 15.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "team-a's fan-out never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its next fan-out would pass its share of the queue: a 429 for team A, nothing queued …
    let (status, v) = fan("sk-team-a", 4).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "tenant_quota", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max-num-queued-reqs-per-tenant"),
        "{v}"
    );
    // … while team B's fan-out of the same width gets in and completes.
    let (status, v) = fan("sk-team-b", 4).await;
    assert_eq!(status, 200, "team-b is not starved by team-a's fan-out: {v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 16);
    first.abort(); // the client goes away: the server cancels the rest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_cache_salt_is_refused_before_any_work() {
    let _shared = TIMING.read().await;
    let s = common::start(&[], tenants);
    let c = client();
    let salt = "s".repeat(4 << 20);
    let body = json!({"model": "tiny", "prompt": vec!["hi"; 16], "max_tokens": 1, "cache_salt": salt});
    let t0 = Instant::now();
    let r = c
        .post(format!("{}/v1/completions", s.base()))
        .bearer_auth("sk-team-a")
        .json(&body)
        .send()
        .await
        .unwrap();
    // The body is 4 MiB of salt plus the rest: over --max-body-bytes, or, just under it, the salt's
    // own limit; either way a 4xx naming the field, answered at once.
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    assert!(status == 413 || status == 400, "{status} {v}");
    let body = json!({"model": "tiny", "prompt": "hi", "max_tokens": 1, "cache_salt": "s".repeat(257)});
    let r = c
        .post(format!("{}/v1/completions", s.base()))
        .bearer_auth("sk-team-a")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "cache_salt", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 256 bytes"),
        "{v}"
    );
    // Another tenant is served at once.
    let r = c
        .post(format!("{}/v1/completions", s.base()))
        .bearer_auth("sk-team-b")
        .json(&json!({"model": "tiny", "prompt": "hi", "max_tokens": 1, "cache_salt": "ok"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(t0.elapsed() < Duration::from_secs(30));
}
