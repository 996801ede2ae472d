//! Liveness means the engine lives: logging to a closed stdout never takes the engine down, and an
//! engine that fails (here: an injected panic) fails its in-flight requests with a clear error, turns
//! `/health` and `/ready` to 503 and ends the process with a non-zero status so the kubelet restarts it.

mod common;

use common::metric_sum as metric;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn client() -> reqwest::Client {
    common::client(Duration::from_secs(60))
}

fn chat(max_tokens: u32, stream: bool) -> serde_json::Value {
    serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true, "stream": stream})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_loses_usage_lines_but_never_the_engine() {
    let mut s = common::Launch::tiny(&[]).stdout(Stdio::piped).start(|_| vec![]);
    // `serve … | head -c 100` after head exits: the read end of stdout is gone.
    drop(s.child.stdout.take());
    let c = client();
    let url = format!("{}/v1/chat/completions", s.base());
    for i in 0..4 {
        let r = c.post(&url).json(&chat(4, i % 2 == 1)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "request {i} after stdout closed");
        let body = r.text().await.unwrap();
        assert!(!body.contains("\"error\""), "request {i}: {body}");
    }
    for path in ["/health", "/ready"] {
        let r = c.get(format!("{}{path}", s.base())).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    let m = c
        .get(format!("{}/metrics", s.admin_base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metric(&m, "modelfleet_log_write_errors_total") >= 1.0,
        "lost usage lines are counted"
    );
    assert!(s.child.try_wait().unwrap().is_none(), "the server still runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_panic_fails_requests_turns_probes_503_and_exits_nonzero() {
    let mut s = common::start(&["--enable-fault-injection", "--admin-token-file"], |dir| {
        let p = dir.join("admin-token");
        std::fs::write(&p, "admin-secret").unwrap();
        vec![p.display().to_string()]
    });
    let c = client();
    let url = format!("{}/v1/chat/completions", s.base());
    // A stream in flight (long enough to still run when the fault hits), and a non-streaming request.
    let mut stream = c.post(&url).json(&chat(2000, true)).send().await.unwrap();
    assert_eq!(stream.status().as_u16(), 200);
    let first = stream.chunk().await.unwrap().expect("the stream started");
    assert!(String::from_utf8_lossy(&first).contains("data:"));
    let pending = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { c.post(&url).json(&chat(2000, false)).send().await })
    };
    // Both run before the fault hits.
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
        if metric(&m, "modelfleet_requests_running") >= 2.0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "both requests run");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Without the admin token the fault endpoint refuses.
    let r = c
        .post(format!("{}/v1/faults/engine-panic", s.admin_base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .post(format!("{}/v1/faults/engine-panic", s.admin_base()))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);

    // The stream ends with an error event and [DONE], never hangs.
    let mut rest = String::new();
    let t0 = Instant::now();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(20), stream.chunk())
        .await
        .expect("the stream ends")
        .unwrap_or(None)
    {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert!(rest.contains("\"error\""), "an error event: {rest}");
    assert!(rest.contains("the engine failed"), "it says why: {rest}");
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
    // The non-streaming request: 503 (retry elsewhere), or finished with `error` if it had started.
    let r = pending.await.unwrap().unwrap();
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(
        status == 503 || v["choices"][0]["finish_reason"] == "error",
        "{status} {v}"
    );
    // Probes say 503 until the process exits, and it exits non-zero.
    let health = c.get(format!("{}/health", s.base())).send().await;
    if let Ok(r) = health {
        assert_eq!(r.status().as_u16(), 503, "a dead engine is not alive");
    }
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "the process exits");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "exit status {status}");
}
