//! Reading one capacity [`Sample`]: each ready replica's output-token counter
//! (`modelfleet_generation_tokens_total`, summed over tenants) and queue depth
//! (`modelfleet_requests_waiting`), from the pods' `/metrics` (`Direct`) or the Prometheus HTTP API
//! (`Prometheus`), whichever `spec.autoscaling.metrics` names (`Direct` without it).
//!
//! Invariants: a sample holds every ready pod or is not taken (a missing pod would read as a
//! scale-down and skew the replica-seconds); answers are read within [`crate::body`]'s byte caps and a
//! timeout ([`crate::pod_metrics`]), and a non-finite or unparsable value fails the sample instead of
//! counting as zero.

use super::measure::{PodSample, Sample};
use crate::pod_metrics::{per_pod, pod_regex, samples, scrape_text};
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
    for sample in samples(text, &[TOKENS, WAITING]) {
        let (idx, v, line) = sample?;
        if !v.is_finite() {
            return Err(format!("non-finite sample: {line}"));
        }
        let slot = if idx == 0 { &mut tokens } else { &mut waiting };
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
        let text = scrape_text(http, ip, port).await?;
        parse(&text)
            .map(|s| (name.clone(), s))
            .map_err(|e| format!("http://{ip}:{port}/metrics: {e}"))
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
    let pod_re = pod_regex(pods);
    let mut found: BTreeMap<String, [Option<f64>; 2]> = BTreeMap::new();
    for (i, metric) in [TOKENS, WAITING].into_iter().enumerate() {
        let q = format!("sum by (pod) ({metric}{{namespace=\"{ns}\",pod=~\"{pod_re}\"}})");
        for (pod, v) in per_pod(http, base, &q).await? {
            found.entry(pod).or_default()[i] = v.filter(|v| v.is_finite());
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
