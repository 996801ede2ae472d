//! Tracing never costs a request its answer, and never holds the process at exit: with the collector
//! down (nothing listens at the endpoint) or hung (it accepts connections and never answers), every
//! request is answered, the spans that could not go are counted (`modelfleet_trace_spans_dropped_total`,
//! `modelfleet_trace_export_failures_total`), and SIGTERM ends the process within the drain and a
//! bounded flush. The traces themselves, read back from a real Jaeger, are e2e/tests/traces.rs's.

mod common;

use common::metric_sum as metric;
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

fn client() -> reqwest::Client {
    common::client(Duration::from_secs(60))
}

/// Sends `n` chat completions (every other one streamed) with a `traceparent` each; all must be 200.
async fn traced_requests(s: &common::Server, n: usize) {
    let c = client();
    for i in 0..n {
        let body = serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": format!("hi {i}")}],
            "max_tokens": 4, "temperature": 0, "stream": i % 2 == 1});
        let r = c
            .post(format!("{}/v1/chat/completions", s.base()))
            .header("traceparent", format!("00-{:032x}-{:016x}-01", i + 1, i + 1))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "request {i}");
        let text = r.text().await.unwrap();
        assert!(!text.contains("\"error\""), "request {i}: {text}");
    }
}

async fn metrics(s: &common::Server) -> String {
    client()
        .get(format!("{}/metrics", s.admin_base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// SIGTERM; the time until the process exited (at most `limit`, or the test fails).
fn terminate(s: &mut common::Server, limit: Duration) -> Duration {
    let t = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &s.pid().to_string()])
            .status()
            .unwrap()
            .success()
    );
    loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "still running {limit:?} after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_spans_not_answers() {
    // A port nothing listens on: every export is refused at once.
    let port = common::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut s = common::Launch::tiny(&[
        "--otlp-traces-endpoint",
        &endpoint,
        "--shutdown-grace-seconds",
        "1",
    ])
    .start(|_| vec![]);
    traced_requests(&s, 12).await;
    // The export thread sends within a second of a span's end.
    let t = Instant::now();
    while metric(&metrics(&s).await, "modelfleet_trace_export_failures_total") < 1.0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the refused exports are counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric(&metrics(&s).await, "modelfleet_trace_spans_exported_total"),
        0.0
    );
    let took = terminate(&mut s, Duration::from_secs(15));
    eprintln!("collector down: SIGTERM → exit in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_collector_fills_a_bounded_queue_and_does_not_hold_the_exit() {
    // Accepts connections (the kernel's backlog) and never reads or answers: each export waits for
    // the client's timeout, and the queue of 16 spans behind it fills.
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", hung.local_addr().unwrap());
    let mut s = common::Launch::tiny(&[
        "--otlp-traces-endpoint",
        &endpoint,
        "--trace-queue",
        "16",
        "--shutdown-grace-seconds",
        "1",
    ])
    .start(|_| vec![]);
    traced_requests(&s, 6).await;
    // Let the first batch reach the collector and hang there, then fill the queue behind it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    traced_requests(&s, 12).await;
    let m = metrics(&s).await;
    let dropped = metric(&m, "modelfleet_trace_spans_dropped_total");
    assert!(dropped > 0.0, "a full queue drops (and counts) spans:\n{m}");
    // The flush at exit waits a bounded time for the hung collector: the drain (1 s) and at most 3 s.
    let took = terminate(&mut s, Duration::from_secs(15));
    eprintln!("collector hung: {dropped} spans dropped; SIGTERM → exit in {took:?}");
    drop(hung);
}
