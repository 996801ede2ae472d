//! Tenant limits on the gateway's request path, against test pods on loopback: OpenAI's
//! `x-ratelimit-*` headers on every answer to a limited tenant, a 429 with `Retry-After` that never
//! reaches a pod, other tenants untouched, and usage (tokens and cost) read from the pods' reports.
//! The fleet-wide store itself is tested against a real Redis in `limits::tests`.

mod common;
use common::*;
use modelfleet_api::tenants::Tenants;
use modelfleet_gateway::fleet::{Fleet, Tenancy};
use modelfleet_gateway::limits::Prices;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The value of the metric line that starts with `prefix`, if any.
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn limited_tenants_get_openai_headers_and_429s_that_never_reach_a_pod() {
    let (pods, port) = pods(2).await;
    let tenants = Tenants::parse(
        "tenants:\n- id: a\n  apiKeys: [sk-tenant-a]\n  requestsPerMinute: 3\n  tokensPerMinute: 100000\n\
         - id: b\n  apiKeys: [sk-tenant-b]\n",
    )
    .unwrap();
    let mut d = deployment(
        &pods.iter().map(|p| p.pod()).collect::<Vec<_>>(),
        Tenancy::Keys(Arc::new(tenants)),
        &[],
    );
    d.prices = Prices {
        input: 2_000_000,
        cached_input: 1_000_000,
        output: 10_000_000,
        currency: "EUR".into(),
    };
    let gw = TestGateway::start(settings(port), Fleet::new(vec![d], true), 8).await;
    let url = gw.url("/v1/chat/completions");
    for (i, stream) in [false, true, false].into_iter().enumerate() {
        let (status, h, body) = post(&url, &chat("limited", stream), Some("sk-tenant-a")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(header(&h, "x-ratelimit-limit-requests"), "3");
        assert_eq!(header(&h, "x-ratelimit-remaining-requests"), (2 - i).to_string());
        assert!(header(&h, "x-ratelimit-reset-requests").ends_with('s'), "{h:?}");
        assert_eq!(header(&h, "x-ratelimit-limit-tokens"), "100000");
        assert!(!header(&h, "x-ratelimit-remaining-tokens").is_empty());
        if stream {
            assert!(
                body.contains("modelfleet-usage"),
                "the stream is passed on unchanged: {body}"
            );
        }
    }
    let hits: usize = pods.iter().map(|p| p.hits()).sum();
    let (status, h, body) = post(&url, &chat("limited", false), Some("sk-tenant-a")).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body.contains("rate_limit_exceeded") && body.contains("requestsPerMinute 3"),
        "{body}"
    );
    let retry: u64 = header(&h, "retry-after").parse().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
    assert_eq!(header(&h, "x-ratelimit-remaining-requests"), "0");
    assert_eq!(
        pods.iter().map(|p| p.hits()).sum::<usize>(),
        hits,
        "refused at the gateway"
    );
    // Another tenant is not limited, and gets no rate-limit headers.
    let (status, h, _) = post(&url, &chat("free", false), Some("sk-tenant-b")).await;
    assert_eq!(status, 200);
    assert!(h.get("x-ratelimit-limit-requests").is_none());
    // Usage from the pods' reports: 7 prompt tokens (2 cached) each; 1 completion token per JSON
    // answer, 2 for the stream. Cost: (5 × 2 + 2 × 1) + completion × 10 per million tokens.
    let t0 = Instant::now();
    let series = "modelfleet_gateway_tokens_total{kind=\"completion\",model=\"llama\",model_deployment=\"chat\",namespace=\"ns\",tenant=\"a\"}";
    while metric(&gw.metrics(), series) != Some(4.0) {
        assert!(t0.elapsed() < Duration::from_secs(5), "{}", gw.metrics());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = gw.metrics();
    let prompt = series.replace("completion", "prompt");
    assert_eq!(metric(&m, &prompt), Some(21.0), "{m}");
    let cost = "modelfleet_gateway_cost_total{currency=\"EUR\",model=\"llama\",model_deployment=\"chat\",namespace=\"ns\",tenant=\"a\"}";
    let expected = (3.0 * 12.0 + 4.0 * 10.0) / 1e6;
    assert!((metric(&m, cost).unwrap() - expected).abs() < 1e-12, "{m}");
    let limited = "modelfleet_gateway_limited_total{model_deployment=\"chat\",namespace=\"ns\",reason=\"requests\",tenant=\"a\"}";
    assert_eq!(metric(&m, limited), Some(1.0), "{m}");
}
