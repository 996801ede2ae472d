//! `serve` as a process: overload answered with fast 429s without growing memory, digest refusal,
//! SIGTERM draining, deadlines, the admin listener's authentication, and `/openapi.json`.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

/// The burst test measures latency: it runs alone (write lock); the others share the machine (read).
static TIMING: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn client() -> reqwest::Client {
    common::client(Duration::from_secs(120))
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn chat_body(max_tokens: u32) -> serde_json::Value {
    serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": "burst"}],
        "max_tokens": max_tokens, "temperature": 0})
}

async fn one(
    c: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> (u16, Duration, serde_json::Value, bool) {
    let t = Instant::now();
    let r = c.post(url).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    let retry_after = r.headers().contains_key("retry-after");
    let v: serde_json::Value = r.json().await.unwrap();
    (status, t.elapsed(), v, retry_after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_ten_times_the_queue_cap_gets_fast_429s_and_memory_stays_flat() {
    let _alone = TIMING.write().await;
    const CAP: usize = 8;
    let s = common::start(
        &["--max-num-seqs", "4", "--max-num-queued-reqs", &CAP.to_string()],
        |_| vec![],
    );
    // Connections close after each answer: a pooled client would keep the burst's 80 connections
    // open, and their buffers on the server (about 20 KiB each) are the client's doing, not memory
    // the burst left behind.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = format!("{}/v1/chat/completions", s.base());
    let body = chat_body(16);
    let (status, _, reference, _) = one(&c, &url, &body).await;
    assert_eq!(status, 200);
    let want = reference["choices"][0]["message"]["content"].clone();
    let burst = |n: usize| {
        let (c, url, body) = (c.clone(), url.clone(), body.clone());
        async move {
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    let (c, url, body) = (c.clone(), url.clone(), body.clone());
                    tokio::spawn(async move { one(&c, &url, &body).await })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        }
    };
    // Steady load (what fits: running + queued), twice, then the burst.
    for _ in 0..2 {
        for (status, _, _, _) in burst(CAP).await {
            assert_eq!(status, 200);
        }
    }
    let steady = rss_kib(s.pid());
    let results = burst(10 * CAP).await;
    // Give the server a moment to finish closing the burst's connections.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = rss_kib(s.pid());
    let mut rejected: Vec<Duration> = Vec::new();
    let mut accepted_took: Vec<Duration> = Vec::new();
    let mut accepted = 0;
    for (status, took, v, retry_after) in &results {
        match status {
            200 => {
                accepted += 1;
                accepted_took.push(*took);
                assert_eq!(
                    v["choices"][0]["message"]["content"], want,
                    "an accepted request is correct"
                );
            }
            429 => {
                assert!(retry_after, "a 429 carries Retry-After");
                assert_eq!(v["error"]["type"], "rate_limit_error");
                rejected.push(*took);
            }
            other => panic!("unexpected status {other}: {v}"),
        }
    }
    rejected.sort();
    assert!(
        !rejected.is_empty() && accepted >= CAP,
        "{accepted} accepted, {} rejected",
        rejected.len()
    );
    accepted_took.sort();
    let p99 = rejected[(rejected.len() * 99 / 100).min(rejected.len() - 1)];
    let accepted_median = accepted_took[accepted_took.len() / 2];
    println!(
        "burst of {}: {accepted} accepted (median {:.1} ms), {} rejected, 429 p99 {:.1} ms; RSS {steady} KiB steady, {after} KiB after",
        10 * CAP,
        accepted_median.as_secs_f64() * 1e3,
        rejected.len(),
        p99.as_secs_f64() * 1e3
    );
    // A 429 is decided at admission, without waiting for the engine. Its latency here is mostly the
    // client's own: 80 connections opened at once on a 2-core machine that may be loaded (a fixed
    // 50 ms bound failed in CI at 64 ms; with other builds running, 429s and accepted requests both
    // took 150-500 ms). So the figure is printed and the bound only catches a gross stall; that the
    // queue is bounded is checked above (rejections, Retry-After) and below (memory).
    assert!(p99 < Duration::from_secs(2), "429 p99 {p99:?}");
    assert!(
        after * 10 <= steady * 11,
        "RSS grew from {steady} KiB to {after} KiB"
    );
}

/// Checked before the load, or (`--verify-beside-load`, as the operator runs it after its fetch
/// container verified the bytes) beside it: a flipped byte is refused either way, with the digests.
#[test]
fn a_model_with_one_flipped_byte_is_refused() {
    for beside in [false, true] {
        refused_with_a_flipped_byte(beside);
    }
}

fn refused_with_a_flipped_byte(beside_load: bool) {
    let _shared = TIMING.blocking_read();
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let digest = modelfleet_runtime::digest::digest_path(&model).unwrap();
    let weights = model.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&weights, bytes).unwrap();
    let log = dir.path().join("termination-log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_modelfleet-runtime"));
    cmd.arg("serve")
        .arg("--model")
        .arg(&model)
        .args(["--digest", &digest, "--port", &common::free_port().to_string()])
        .args(["--admin-port", &common::free_port().to_string()])
        .arg("--termination-log")
        .arg(&log);
    if beside_load {
        cmd.arg("--verify-beside-load");
    }
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("digest mismatch"), "{stderr}");
    assert!(
        stderr.contains(&digest),
        "the message names the expected digest: {stderr}"
    );
    let line = std::fs::read_to_string(&log).unwrap();
    assert!(line.starts_with("digest mismatch"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_zero() {
    let _shared = TIMING.read().await;
    let mut s = common::start(&["--shutdown-grace-seconds", "60"], |_| vec![]);
    let c = client();
    let url = format!("{}/v1/chat/completions", s.base());
    let mut body = chat_body(2000);
    body["ignore_eos"] = true.into();
    let in_flight = {
        let (c, url, body) = (c.clone(), url.clone(), body.clone());
        tokio::spawn(async move { one(&c, &url, &body).await })
    };
    // Wait until it runs, then SIGTERM.
    let metrics = format!("{}/metrics", s.admin_base());
    let t0 = Instant::now();
    loop {
        let m = c.get(&metrics).send().await.unwrap().text().await.unwrap();
        if m.lines()
            .any(|l| l.starts_with("modelfleet_requests_running{") && l.ends_with(" 1"))
        {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the request never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ok = Command::new("kill")
        .args(["-TERM", &s.pid().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let ready = c.get(format!("{}/ready", s.base())).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 503, "/ready turns 503 while draining");
    let (status, _, v, _) = one(&c, &url, &chat_body(4)).await;
    assert_eq!(status, 503, "new requests are refused while draining: {v}");
    let (status, _, v, _) = in_flight.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        v["choices"][0]["finish_reason"], "length",
        "the in-flight request finished: {v}"
    );
    assert_eq!(v["usage"]["completion_tokens"], 2000);
    let t0 = Instant::now();
    let code = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the server did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "exit status {code:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_larger_than_the_kv_pool_is_a_413_not_a_500_with_either_cache_dtype() {
    let _shared = TIMING.read().await;
    // 8 blocks of 16 tokens: the pool holds 128 tokens, less than the model's context.
    let s = common::start(&["--num-kv-blocks", "8", "--block-size", "16"], |_| vec![]);
    let c = client();
    let url = format!("{}/v1/chat/completions", s.base());
    let (status, _, v, _) = one(&c, &url, &chat_body(200)).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error"]["param"], "max_tokens");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("context limit of 128 tokens"),
        "{v}"
    );
    let (status, _, v, _) = one(&c, &url, &chat_body(16)).await;
    assert_eq!(status, 200, "a request that fits is served: {v}");
    // The same pool in f16 and in 8 bits (`--kv-cache-dtype float16`, `q8_0`) serves the same way, and
    // the metrics name the cache type.
    for dtype in ["float16", "q8_0"] {
        let s = common::start(
            &[
                "--num-kv-blocks",
                "8",
                "--block-size",
                "16",
                "--kv-cache-dtype",
                dtype,
            ],
            |_| vec![],
        );
        let url = format!("{}/v1/chat/completions", s.base());
        let (status, _, v, _) = one(&c, &url, &chat_body(200)).await;
        assert_eq!(status, 413, "{dtype}: {v}");
        let (status, _, v, _) = one(&c, &url, &chat_body(16)).await;
        assert_eq!(status, 200, "{dtype}: {v}");
        assert!(v["usage"]["completion_tokens"].as_u64().unwrap() >= 1, "{v}");
        let metrics = common::http(s.admin_port, "GET", "/metrics", &[], "").1;
        assert!(
            metrics.contains(&format!("cache_dtype=\"{dtype}\"")),
            "{dtype}: {}",
            metrics
                .lines()
                .filter(|l| l.contains("cache_config"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_admin_auth_and_openapi() {
    let _shared = TIMING.read().await;
    let s = common::start(&[], |dir| {
        let token = dir.join("admin-token");
        std::fs::write(&token, "admin-secret\n").unwrap();
        vec!["--admin-token-file".into(), token.display().to_string()]
    });
    let c = client();
    // A deadline that has passed before the first token: 504 with a clear message.
    let mut body = chat_body(8);
    body["timeout"] = 0.000_001.into();
    let (status, _, v, _) = one(&c, &format!("{}/v1/chat/completions", s.base()), &body).await;
    assert_eq!(status, 504, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("deadline"),
        "{v}"
    );
    // The admin listener: its own port and token.
    let admin = format!("http://127.0.0.1:{}/v1/adapters", s.admin_port);
    assert_eq!(c.get(&admin).send().await.unwrap().status().as_u16(), 401);
    let wrong = c.get(&admin).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let right = c.get(&admin).bearer_auth("admin-secret").send().await.unwrap();
    assert_eq!(right.status().as_u16(), 200);
    let api_port_admin = c
        .get(format!("{}/v1/adapters", s.base()))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(
        api_port_admin.status().as_u16(),
        404,
        "admin routes are not on the API port"
    );
    // The OpenAPI document.
    let doc: serde_json::Value = c
        .get(format!("{}/openapi.json", s.base()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/v1/chat/completions"]["post"]["responses"]["429"].is_object());
}

/// An OpenAI `usage` object in the runtime's report format.
fn report_of(u: &serde_json::Value) -> String {
    format!(
        "prompt={} cached={} completion={}",
        u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], u["completion_tokens"]
    )
}

/// The usage report the gateway charges tenants from: a JSON answer's `x-modelfleet-usage` header, and —
/// when the request asks with that header — a stream's closing `: modelfleet-usage` comment, both equal
/// to the OpenAI `usage` of the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_reported_to_the_gateway_as_openai_counts_it() {
    let _shared = TIMING.read().await;
    let s = common::start(&[], |_| vec![]);
    let c = client();
    let url = format!("{}/v1/chat/completions", s.base());
    let r = c.post(&url).json(&chat_body(8)).send().await.unwrap();
    let header = r.headers()["x-modelfleet-usage"].to_str().unwrap().to_string();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(header, report_of(&v["usage"]));
    let mut body = chat_body(8);
    body["stream"] = true.into();
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let text = |r: reqwest::RequestBuilder| async move { r.send().await.unwrap().text().await.unwrap() };
    let plain = text(c.post(&url).json(&body)).await;
    assert!(!plain.contains("modelfleet-usage"), "only when asked: {plain}");
    let asked = text(c.post(&url).header("x-modelfleet-usage", "1").json(&body)).await;
    let comment = asked
        .lines()
        .find_map(|l| l.strip_prefix(": modelfleet-usage "))
        .unwrap_or_else(|| panic!("no report in {asked}"));
    let chunk: serde_json::Value = asked
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find(|c| !c["usage"].is_null())
        .unwrap();
    assert_eq!(comment, report_of(&chunk["usage"]));
    assert!(asked.trim_end().ends_with("data: [DONE]"), "{asked}");
}
