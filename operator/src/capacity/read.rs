//! Reading one capacity [`Sample`]: each ready replica's output-token counter
//! (`modelfleet_generation_tokens_total`, summed over tenants) and queue depth
//! (`modelfleet_requests_waiting`), from the pods' `/metrics` (`Direct`) or the Prometheus HTTP API
//! (`Prometheus`), whichever `spec.autoscaling.metrics` names (`Direct` without it).
//!
//! Invariants: a sample holds every ready pod or is not taken (a missing pod would read as a
//! scale-down and skew the replica-seconds); answers are read within [`crate::body`]'s byte caps and a
//! timeout, and a non-finite or unparsable value fails the sample instead of counting as zero.

use super::measure::{PodSample, Sample};
use crate::autoscaler::metrics::{PROMETHEUS_TIMEOUT, SCRAPE_TIMEOUT, regex_escape};
use crate::body::{MAX_METRICS_BYTES, MAX_PROMETHEUS_BYTES, read_capped};
use modelfleet_api::metric_names as names;
use std::collections::BTreeMap;
use std::time::Instant;

/// The counter of generated tokens (docs/design.md).
pub const TOKENS: &str = names::GENERATION_TOKENS;
/// The queue gauge.
pub const WAITING: &str = names::REQUESTS_WAITING;

/// Sums `TOKENS` and `WAITING` over their label sets in Prometheus text. The queue gauge must be
/// there; the token counter has no series until a request finished, so its absence reads as 0.
pub fn parse(text: &str) -> Result<PodSample, String> {
    let (mut tokens, mut waiting) = (None::<f64>, None::<f64>);
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let slot = match &line[..end] {
            TOKENS => &mut tokens,
            WAITING => &mut waiting,
            _ => continue,
        };
        let rest = &line[end..];
        let value = if rest.starts_with('{') {
            rest.rfind('}').map_or("", |i| &rest[i + 1..])
        } else {
            rest
        };
        let v: f64 = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .filter(|v: &f64| v.is_finite())
            .ok_or_else(|| format!("unparsable or non-finite sample: {line}"))?;
        *slot = Some(slot.unwrap_or(0.0) + v);
    }
    match waiting {
        Some(waiting) => Ok(PodSample {
            tokens: tokens.unwrap_or(0.0),
            waiting,
        }),
        None => Err(format!("{WAITING} missing")),
    }
}

/// Scrapes `http://<ip>:<port>/metrics` of every `(pod, ip)`; fails if any does.
pub async fn scrape(http: &reqwest::Client, pods: &[(String, String)], port: i32) -> Result<Sample, String> {
    let at = Instant::now();
    let reads = pods.iter().map(|(name, ip)| async move {
        let url = format!("http://{ip}:{port}/metrics");
        let resp = http
            .get(&url)
            .timeout(SCRAPE_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("{url}: HTTP {}", resp.status()));
        }
        let body = read_capped(resp, MAX_METRICS_BYTES)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let text = String::from_utf8_lossy(&body);
        parse(&text)
            .map(|s| (name.clone(), s))
            .map_err(|e| format!("{url}: {e}"))
    });
    let pods = futures::future::join_all(reads)
        .await
        .into_iter()
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    Ok(Sample { at, pods })
}

/// Reads the same figures from Prometheus for `pods` of namespace `ns` (Kubernetes pod discovery's
/// `namespace` and `pod` labels); every pod must have both series.
pub async fn query(http: &reqwest::Client, base: &str, ns: &str, pods: &[String]) -> Result<Sample, String> {
    let at = Instant::now();
    let pod_re = pods.iter().map(|p| regex_escape(p)).collect::<Vec<_>>().join("|");
    let url = format!("{}/api/v1/query", base.trim_end_matches('/'));
    let mut found: BTreeMap<String, [Option<f64>; 2]> = BTreeMap::new();
    for (i, metric) in [TOKENS, WAITING].into_iter().enumerate() {
        let q = format!("sum by (pod) ({metric}{{namespace=\"{ns}\",pod=~\"{pod_re}\"}})");
        let answer = http
            .get(&url)
            .query(&[("query", q.as_str())])
            .timeout(PROMETHEUS_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("Prometheus {url}: {e}"))?;
        let body = read_capped(answer, MAX_PROMETHEUS_BYTES)
            .await
            .map_err(|e| format!("Prometheus {url}: {e}"))?;
        let resp: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| format!("Prometheus {url}: {e}"))?;
        if resp["status"] != "success" {
            return Err(format!("Prometheus query {q} failed: {}", resp["error"]));
        }
        for series in resp["data"]["result"].as_array().into_iter().flatten() {
            let pod = series["metric"]["pod"].as_str().unwrap_or_default().to_string();
            let v = series["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite());
            found.entry(pod).or_default()[i] = v;
        }
    }
    let pods = pods
        .iter()
        .map(|p| match found.get(p) {
            Some([tokens, Some(waiting)]) => Ok((
                p.clone(),
                PodSample {
                    tokens: tokens.unwrap_or(0.0),
                    waiting: *waiting,
                },
            )),
            _ => Err(format!("Prometheus has no recent {WAITING} for pod {p}")),
        })
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    Ok(Sample { at, pods })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_over_tenants_and_requires_both() {
        let text = "# TYPE modelfleet_generation_tokens_total counter\n\
                    modelfleet_generation_tokens_total{model=\"m\",tenant=\"a\"} 100\n\
                    modelfleet_generation_tokens_total{model=\"m\",tenant=\"b\"} 23\n\
                    modelfleet_generation_tokens_total_created 5\n\
                    modelfleet_requests_waiting{model=\"m\"} 2\n\
                    vllm:generation_tokens_total{model_name=\"m\"} 999\n";
        assert_eq!(
            parse(text),
            Ok(PodSample {
                tokens: 123.0,
                waiting: 2.0
            })
        );
        // No request finished yet: no token series, zero tokens.
        assert_eq!(
            parse("modelfleet_requests_waiting 1\n").map(|s| s.tokens),
            Ok(0.0)
        );
        assert!(parse("modelfleet_generation_tokens_total 5\n").is_err());
        assert!(parse("modelfleet_requests_waiting 1\nmodelfleet_generation_tokens_total NaN\n").is_err());
    }
}
