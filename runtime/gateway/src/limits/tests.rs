//! The limiter against a real Redis (`redis-server`, a Debian package `make setup` installs) and against
//! its local twin: the same scenarios, with two limiters standing for two gateway replicas.

use super::store::Store;
use super::*;
use axum::http::HeaderMap;
use modelfleet_api::tenants::Tenants;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// A redis-server of its own on a free loopback port, killed on drop.
struct Redis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Redis {
    fn start() -> Redis {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (Debian package redis-server; `make setup` installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Redis {
            child,
            port,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn limiter(&self, failure: FailureMode) -> Arc<Limiter> {
        let store = Store::redis(&self.url(), Duration::from_millis(250)).unwrap();
        Limiter::new(store, failure, &Metrics::new())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tenant(limits: &str) -> Tenant {
    let text = format!("tenants:\n- id: team-a\n  apiKeys: [sk-team-a-1]\n{limits}");
    Tenants::parse(&text).unwrap().all()[0].as_ref().clone()
}

fn who() -> Who {
    Who {
        namespace: "ns".into(),
        deployment: "chat".into(),
        tenant: "team-a".into(),
        model: "llama".into(),
    }
}

fn prices() -> Prices {
    Prices {
        input: 1_000_000,
        cached_input: 500_000,
        output: 10_000_000,
        currency: "EUR".into(),
    }
}

fn code(r: &Result<Lease, Refused>) -> Option<(u16, String)> {
    r.as_ref()
        .err()
        .map(|e| (e.error.status(), e.error.code.clone().unwrap_or_default()))
}

/// Admissions until the first refusal (at most `max`), alternating between `limiters`.
async fn admitted_until_refused(limiters: &[Arc<Limiter>], t: &Tenant, max: usize) -> (usize, Refused) {
    let mut held = Vec::new();
    for i in 0..max {
        match limiters[i % limiters.len()].admit(who(), t, prices(), 0).await {
            Ok(l) => held.push(l),
            Err(r) => return (i, r),
        }
    }
    panic!("{max} admitted, none refused")
}

/// Polls `f` until it is true, for at most 3 s (settling is asynchronous).
async fn eventually(mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while !f().await {
        assert!(Instant::now() < deadline, "not within 3 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn answered(usage: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(meter::USAGE_HEADER, usage.parse().unwrap());
    h
}

#[test]
fn prices_round_up_and_cached_tokens_cost_less() {
    let u = Usage {
        prompt: 1000,
        cached: 600,
        completion: 100,
    };
    // 400 × 1.0 + 600 × 0.5 + 100 × 10.0 per million = 0.0017 EUR = 1700 millionths.
    assert_eq!(prices().cost(&u), 1700);
    assert_eq!(
        prices().cost(&Usage {
            completion: 1,
            ..Default::default()
        }),
        10
    );
    let odd = Prices {
        output: 1,
        ..prices()
    };
    assert_eq!(
        odd.cost(&Usage {
            completion: 1,
            ..Default::default()
        }),
        1,
        "rounded up"
    );
    assert_eq!(money(25_500_000), "25.5");
    assert_eq!(money(3_000_000), "3");
}

#[tokio::test]
async fn requests_per_minute_hold_for_the_sum_over_replicas() {
    let r = Redis::start();
    let two = [r.limiter(FailureMode::Closed), r.limiter(FailureMode::Closed)];
    let t = tenant("  requestsPerMinute: 10\n");
    let first = two[0].admit(who(), &t, prices(), 0).await.unwrap();
    let h = first.headers.pairs();
    assert!(h.contains(&("x-ratelimit-limit-requests", "10".into())), "{h:?}");
    assert!(
        h.contains(&("x-ratelimit-remaining-requests", "9".into())),
        "{h:?}"
    );
    let (n, refused) = admitted_until_refused(&two, &t, 30).await;
    assert_eq!(n, 9, "10 per minute over both replicas, one taken before");
    assert_eq!(refused.error.status(), 429);
    assert_eq!(refused.error.code.as_deref(), Some("rate_limit_exceeded"));
    assert!(
        (1..=7).contains(&refused.error.retry_after().unwrap()),
        "{:?}",
        refused.error
    );
    assert!(
        refused.error.message.contains("requestsPerMinute 10"),
        "{}",
        refused.error.message
    );
    let remaining = refused.headers.pairs();
    assert!(
        remaining.contains(&("x-ratelimit-remaining-requests", "0".into())),
        "{remaining:?}"
    );
    // The local twin: the same answer for one replica.
    let local = Limiter::new(Store::local(), FailureMode::Closed, &Metrics::new());
    let (n, refused) = admitted_until_refused(&[local], &t, 30).await;
    assert_eq!(
        (n, refused.error.code.as_deref()),
        (10, Some("rate_limit_exceeded"))
    );
}

#[tokio::test]
async fn concurrency_is_fleet_wide_and_freed_when_a_response_ends() {
    let r = Redis::start();
    let two = [r.limiter(FailureMode::Closed), r.limiter(FailureMode::Closed)];
    let t = tenant("  maxConcurrentRequests: 2\n");
    let a = two[0].admit(who(), &t, prices(), 0).await.unwrap();
    let _b = two[1].admit(who(), &t, prices(), 0).await.unwrap();
    let refused = two[1].admit(who(), &t, prices(), 0).await;
    assert_eq!(code(&refused), Some((429, "tenant_quota".into())));
    drop(a);
    eventually(async || two[1].admit(who(), &t, prices(), 0).await.is_ok()).await;
}

#[tokio::test]
async fn a_budget_stops_within_one_request_and_survives_a_restart() {
    let r = Redis::start();
    let gw = r.limiter(FailureMode::Closed);
    // 0.0015 EUR a day; each answer costs 100 completion tokens × 10 EUR/M = 0.001 EUR: the second
    // is admitted (0.001 spent), the third refused (0.002 spent: over by less than one request).
    let t = tenant("  budget: {daily: \"0.0015\"}\n");
    let mut served = 0;
    for _ in 0..5 {
        match gw.admit(who(), &t, prices(), 0).await {
            Ok(mut lease) => {
                lease.serving(&answered("prompt=0 cached=0 completion=100"));
                served += 1;
                drop(lease);
                let deadline = Instant::now() + Duration::from_secs(3);
                // Wait for the settlement to land before the next admission.
                loop {
                    let spent = gw.store().usage(&hour_now()).await.unwrap();
                    let row = "ns/chat/team-a/llama|cost_micros";
                    if spent.get(row).copied().unwrap_or(0) >= 1000 * served {
                        break;
                    }
                    assert!(Instant::now() < deadline);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Err(refused) => {
                assert_eq!(refused.error.code.as_deref(), Some("insufficient_quota"));
                assert!(
                    refused.error.message.contains("daily budget (0.0015 EUR)"),
                    "{}",
                    refused.error.message
                );
                break;
            }
        }
    }
    assert_eq!(
        served, 2,
        "spent 0.002 ≥ 0.0015 after the second: one request over, at most"
    );
    // A new replica (a restart) reads the same spend.
    let restarted = r.limiter(FailureMode::Closed);
    let again = restarted.admit(who(), &t, prices(), 0).await;
    assert_eq!(code(&again), Some((429, "insufficient_quota".into())));
    let row = restarted.store().usage(&hour_now()).await.unwrap();
    assert_eq!(row.get("ns/chat/team-a/llama|requests"), Some(&2));
    assert_eq!(row.get("ns/chat/team-a/llama|completion_tokens"), Some(&200));
}

#[tokio::test]
async fn tokens_are_estimated_at_admission_and_corrected_from_the_report() {
    let r = Redis::start();
    let gw = r.limiter(FailureMode::Closed);
    let t = tenant("  tokensPerMinute: 100\n");
    let mut lease = gw.admit(who(), &t, prices(), 30).await.unwrap();
    assert!(
        lease
            .headers
            .pairs()
            .contains(&("x-ratelimit-remaining-tokens", "70".into()))
    );
    // The stream's events count as they pass; the report at its end replaces the estimates.
    let events = "data: {}\n\n".repeat(20);
    lease.serving(&HeaderMap::new());
    lease.streamed(events.as_bytes());
    lease.streamed(b": modelfleet-usage prompt=20 cached=0 completion=200\n\ndata: [DONE]\n\n");
    drop(lease);
    // 100 - 220 = -120 tokens: refused until ~72 s of refill.
    let mut refused = None;
    eventually(async || {
        refused = gw.admit(who(), &t, prices(), 0).await.err();
        refused
            .as_ref()
            .is_some_and(|r| r.error.retry_after().unwrap_or(0) > 60)
    })
    .await;
    let refused = refused.unwrap();
    assert_eq!(refused.error.code.as_deref(), Some("rate_limit_exceeded"));
    assert!(refused.error.message.contains("tokensPerMinute 100"));
    assert!(
        (70..=74).contains(&refused.error.retry_after().unwrap()),
        "{:?}",
        refused.error
    );
}

#[tokio::test]
async fn an_unreachable_store_fails_open_or_closed_at_once() {
    let mut r = Redis::start();
    let open = r.limiter(FailureMode::Open);
    let closed = r.limiter(FailureMode::Closed);
    let t = tenant("  requestsPerMinute: 1000\n");
    assert!(closed.admit(who(), &t, prices(), 0).await.is_ok());
    let _ = r.child.kill();
    let _ = r.child.wait();
    for _ in 0..3 {
        let started = Instant::now();
        let refused = closed.admit(who(), &t, prices(), 0).await;
        assert_eq!(code(&refused), Some((503, "limits_unavailable".into())));
        let lease = open.admit(who(), &t, prices(), 0).await;
        assert!(
            lease.is_ok_and(|l| l.headers.pairs().is_empty()),
            "admitted without limits"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    let errors = open.metrics.store_errors.with_label_values(&["admit"]).get();
    assert!(errors >= 3, "{errors}");
}
