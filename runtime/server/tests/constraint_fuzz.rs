//! A fuzzer that keeps poison constraints out: hostile structured-output requests drawn by structure
//! (tests/constraint_gen) against a real `serve` on the real SmolLM2, for a bounded time. Every input
//! must end in 200, a 4xx refusal (400; 413 for a body over the size limit; 429 when the compile
//! threads' queue is full) or a
//! constraint that gave out while decoding — never a 5xx, a dropped connection or a dead process —
//! within its budget (the server's 1.5 s compile budget plus a short generation).
//!
//! `MODELFLEET_FUZZ_SECONDS` sets the run's length (60 in `make test`, 20 in a plain `cargo test`); `MODELFLEET_FUZZ_SEED` its first
//! seed (default: from the clock, printed). A longer run (docs/api.md):
//! `MODELFLEET_FUZZ_SECONDS=1800 cargo test --release -p modelfleet-runtime --test constraint_fuzz -- --nocapture`.
//! Inputs that once failed live in tests/data/poison/ and are replayed first; a failing input is
//! written to the system's temp directory and named in the panic, to become such a case.
//! `MODELFLEET_FUZZ_ONLY=s1,s2` sends just those seeds, one at a time, timed (to find a slow one).

mod common;
mod constraint_gen;

use constraint_gen::{Drawn, Gen};
use serde_json::Value;
use std::time::{Duration, Instant};

const KEY: &str = "sk-fuzzer-000001";
/// Concurrent requests (more than the compile threads, so their queue and its 429 are exercised).
const CONCURRENCY: usize = 4;
/// Longest an input may take, end to end: a hang detector, not a latency target — the compile budget
/// (1.5 s, enforced by the server), the prefill of a tool list's prompt (up to a few thousand tokens),
/// a 2-token generation, and waiting behind the other inputs on a loaded 2-core machine (a run beside
/// a release build saw 10 s).
const INPUT_BUDGET: Duration = Duration::from_secs(30);

fn tenants(dir: &std::path::Path) -> Vec<String> {
    common::tenants_file(dir, &[("fuzzer", KEY)])
}

/// The recorded regressions: `{"path": …, "body": …}` files.
fn regressions() -> Vec<Drawn> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/poison");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let v: Value = serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap();
        let path = if v["path"] == "/v1/chat/completions" {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        out.push(Drawn {
            path,
            body: v["body"].clone(),
            what: "regression",
        });
    }
    out
}

#[derive(Default)]
struct Tally {
    inputs: u64,
    ok: u64,
    refused: u64,
    busy: u64,
    slowest: Duration,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_constraints_end_in_an_answer_never_a_crash() {
    let seconds: u64 = std::env::var("MODELFLEET_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("MODELFLEET_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        });
    println!("fuzz: seed {seed}, {seconds} s");
    let server = common::Launch::smollm2(&[]).start(tenants);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(INPUT_BUDGET * 2)
        .build()
        .unwrap();
    let base = server.base();
    common::wait_ready(&server);
    let t0 = Instant::now();

    // `MODELFLEET_FUZZ_ONLY=s1,s2`: those seeds alone, one at a time, timed (to find a slow input).
    if let Ok(only) = std::env::var("MODELFLEET_FUZZ_ONLY") {
        for s in only.split(',').filter_map(|s| s.trim().parse::<u64>().ok()) {
            let d = Gen::new(s).request("smollm2");
            let t = Instant::now();
            let r = http
                .post(format!("{base}{}", d.path))
                .bearer_auth(KEY)
                .json(&d.body)
                .send()
                .await
                .unwrap();
            let status = r.status();
            let text = r.text().await.unwrap_or_default();
            println!(
                "fuzz: seed {s} ({}): {status} in {:?}: {}",
                d.what,
                t.elapsed(),
                text.chars().take(300).collect::<String>()
            );
        }
        return;
    }
    let mut tally = Tally::default();
    let mut queue: std::collections::VecDeque<(u64, Drawn)> =
        regressions().into_iter().map(|d| (u64::MAX, d)).collect();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut next_seed = seed;
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < CONCURRENCY && (Instant::now() < deadline || !queue.is_empty()) {
            let (s, drawn) = queue.pop_front().unwrap_or_else(|| {
                next_seed += 1;
                (next_seed, Gen::new(next_seed).request("smollm2"))
            });
            let (http, url) = (http.clone(), format!("{base}{}", drawn.path));
            running.spawn(async move {
                let t = Instant::now();
                let r = http.post(url).bearer_auth(KEY).json(&drawn.body).send().await;
                let outcome = match r {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let text = r.text().await.unwrap_or_default();
                        Ok((status, text))
                    }
                    Err(e) => Err(e.to_string()),
                };
                (s, drawn, outcome, t.elapsed())
            });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let (s, drawn, outcome, took) = done.unwrap();
        tally.inputs += 1;
        tally.slowest = tally.slowest.max(took);
        if took > Duration::from_secs(2) {
            let status = outcome.as_ref().map(|(s, _)| *s).unwrap_or(0);
            println!("fuzz: seed {s} ({}) took {took:?}, {status}", drawn.what);
        }
        let verdict = match &outcome {
            Ok((200, _)) => {
                tally.ok += 1;
                None
            }
            // 400, or 413 for a body past --max-body-bytes.
            Ok((400 | 413, _)) => {
                tally.refused += 1;
                None
            }
            Ok((429, text)) if text.contains("compile_queue_full") => {
                tally.busy += 1;
                None
            }
            Ok((status, text)) => Some(format!(
                "{status}: {}",
                text.chars().take(500).collect::<String>()
            )),
            Err(e) => Some(format!("no answer: {e}")),
        };
        let verdict = verdict.or_else(|| (took > INPUT_BUDGET).then(|| format!("took {took:?}")));
        if let Some(why) = verdict {
            let file = std::env::temp_dir().join(format!("modelfleet-poison-{s}.json"));
            let case = serde_json::json!({"path": drawn.path, "body": drawn.body});
            std::fs::write(&file, serde_json::to_vec_pretty(&case).unwrap()).unwrap();
            panic!(
                "seed {s} ({}) failed: {why}; the input is in {} (add it to tests/data/poison/)",
                drawn.what,
                file.display()
            );
        }
    }
    let alive = http.get(format!("{base}/health")).send().await;
    assert!(alive.is_ok_and(|r| r.status() == 200), "the server is gone");
    println!(
        "fuzz: {} inputs in {:?} (seeds {}..={}): {} answered, {} refused (400), {} compile queue full (429); slowest {:?}",
        tally.inputs,
        t0.elapsed(),
        seed + 1,
        next_seed,
        tally.ok,
        tally.refused,
        tally.busy,
        tally.slowest
    );
    assert!(tally.inputs > 0);
}
