//! Demand as the fleet gateway sees it, for scaling from and to zero: requests it holds because a
//! deployment has no Ready pod (`modelfleet_gateway_pending_requests`) and requests it answered
//! (`modelfleet_gateway_requests_total`, and the requests its fallbacks took,
//! `modelfleet_gateway_fallbacks_total{result="moved"}`: growth means requests are arriving), summed over the
//! gateway's pods, read from each pod's `/metrics` directly (Direct). The operator only reads; the
//! gateway never writes a ModelDeployment, so `status.desiredReplicas` keeps a single writer.
//!
//! Invariant: a reading exists only when every Ready gateway pod answered (no scale decision on a
//! partial view); a deployment the gateway never saw reads as zero demand.

use modelfleet_api::exposition::samples_of;
use modelfleet_api::metric_names::{GATEWAY_FALLBACKS, GATEWAY_PENDING_REQUESTS, GATEWAY_REQUESTS};
use std::time::Duration;

/// Largest `/metrics` page read from a gateway pod.
pub const MAX_PAGE_BYTES: usize = 8 << 20;

/// One deployment's demand at the gateway.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Demand {
    /// Requests held now, waiting for a Ready pod.
    pub pending: f64,
    /// Requests answered or moved to a fallback so far (a counter: compare two readings).
    pub requests: f64,
    /// Of those, requests `spec.fallback` moved elsewhere (a counter: growth at 0 replicas wakes it).
    pub moved: f64,
    /// Gateway pods read.
    pub gateways: usize,
}

/// The demand for ModelDeployment `ns/md` on one gateway page.
pub fn parse_demand(page: &str, ns: &str, md: &str) -> Result<Demand, String> {
    let mut d = Demand {
        gateways: 1,
        ..Demand::default()
    };
    for name in [GATEWAY_PENDING_REQUESTS, GATEWAY_REQUESTS, GATEWAY_FALLBACKS] {
        for s in samples_of(page, name) {
            let s = s?;
            if s.label("namespace") != Some(ns) || s.label("model_deployment") != Some(md) {
                continue;
            }
            match name {
                GATEWAY_PENDING_REQUESTS => d.pending += s.value,
                GATEWAY_REQUESTS => d.requests += s.value,
                // Requests its fallbacks took are demand too (a deployment at zero scales up while
                // they answer); the other results are moves that did not happen.
                _ if s.label("result") == Some("moved") => {
                    d.requests += s.value;
                    d.moved += s.value;
                }
                _ => {}
            }
        }
    }
    Ok(d)
}

async fn page(client: &reqwest::Client, url: &str) -> Result<String, String> {
    let mut resp = client
        .get(url)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("{url}: HTTP {}", resp.status()));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        if out.len() + chunk.len() > MAX_PAGE_BYTES {
            return Err(format!("{url}: page larger than {MAX_PAGE_BYTES} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    String::from_utf8(out).map_err(|e| format!("{url}: {e}"))
}

/// Reads every gateway pod's `/metrics` at `ips` and parses each page; fails if any fails (the error
/// names the page). Each result comes with its pod's IP.
pub async fn read_each<T>(
    client: &reqwest::Client,
    ips: &[String],
    port: u16,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<(String, T)>, String> {
    let parse = &parse;
    let pages = futures::future::join_all(ips.iter().map(|ip| async move {
        let url = format!("http://{ip}:{port}/metrics");
        let text = page(client, &url).await?;
        parse(&text)
            .map(|t| (ip.clone(), t))
            .map_err(|e| format!("{url}: {e}"))
    }))
    .await;
    pages.into_iter().collect()
}

/// Sums the demand for `ns/md` over the gateway pods at `ips`; fails if any fails.
pub async fn read_demand(
    client: &reqwest::Client,
    ips: &[String],
    port: u16,
    ns: &str,
    md: &str,
) -> Result<Demand, String> {
    let pages = read_each(client, ips, port, |text| parse_demand(text, ns, md)).await;
    let mut total = Demand::default();
    for (_, d) in pages? {
        total.pending += d.pending;
        total.requests += d.requests;
        total.moved += d.moved;
        total.gateways += 1;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_one_deployment() {
        let page = "# TYPE modelfleet_gateway_pending_requests gauge\n\
            modelfleet_gateway_pending_requests{model_deployment=\"chat\",namespace=\"a\"} 3\n\
            modelfleet_gateway_pending_requests{model_deployment=\"chat\",namespace=\"b\"} 7\n\
            modelfleet_gateway_requests_total{model_deployment=\"chat\",namespace=\"a\",outcome=\"ok\",pod=\"p\",tenant=\"t\"} 10\n\
            modelfleet_gateway_requests_total{model_deployment=\"chat\",namespace=\"a\",outcome=\"429\",pod=\"\",tenant=\"t\"} 2\n\
            modelfleet_gateway_requests_total{model_deployment=\"other\",namespace=\"a\",outcome=\"ok\",pod=\"p\",tenant=\"t\"} 5\n";
        assert_eq!(
            parse_demand(page, "a", "chat").unwrap(),
            Demand {
                pending: 3.0,
                requests: 12.0,
                moved: 0.0,
                gateways: 1
            }
        );
        assert_eq!(parse_demand(page, "c", "chat").unwrap().pending, 0.0);
        assert!(parse_demand("modelfleet_gateway_pending_requests{x=\"1\"} NaN\n", "a", "chat").is_err());
    }

    #[test]
    fn requests_its_fallbacks_took_are_demand() {
        let page = "modelfleet_gateway_requests_total{model_deployment=\"big\",namespace=\"a\",outcome=\"ok\",pod=\"\",tenant=\"t\"} 1\n\
            modelfleet_gateway_fallbacks_total{model_deployment=\"big\",namespace=\"a\",reason=\"no_ready_replica\",result=\"moved\",target=\"small\"} 4\n\
            modelfleet_gateway_fallbacks_total{model_deployment=\"big\",namespace=\"a\",reason=\"saturated\",result=\"other_tenant\",target=\"small\"} 9\n\
            modelfleet_gateway_fallbacks_total{model_deployment=\"small\",namespace=\"a\",reason=\"saturated\",result=\"moved\",target=\"tiny\"} 2\n";
        let big = parse_demand(page, "a", "big").unwrap();
        assert_eq!((big.requests, big.moved), (5.0, 4.0));
        assert_eq!(parse_demand(page, "a", "small").unwrap().moved, 2.0);
    }
}
