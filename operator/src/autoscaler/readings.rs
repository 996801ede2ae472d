//! One pass's reading of the ready replicas for a deployment with objectives: the autoscaler's gauges
//! ([`PodMetrics`]) and the cumulative counters of [`latency`] from the same source — one scrape of each
//! pod's `/metrics` (`Direct`), or PromQL over the current values of the same series (`Prometheus`:
//! `sum by (pod)` of the counters and gauges, `sum by (pod, le)` of the histograms' buckets).
//!
//! Invariants (as [`super::metrics`]): every ready pod is in the reading or the reading fails; a value
//! that does not parse or is not finite fails it.

use super::latency::{self, Buckets, PodCounters};
use super::metrics::{PodMetrics, parse_exposition};
use crate::pod_metrics::{per_pod, per_series, pod_regex, scrape_text};
use modelfleet_api::metric_names as names;
use std::collections::BTreeMap;

/// Gauges and counters of every pod, by pod name.
pub type Reading = (Vec<PodMetrics>, BTreeMap<String, PodCounters>);

/// Scrapes every `(pod, ip)` once and parses both.
pub async fn scrape(http: &reqwest::Client, pods: &[(String, String)], port: i32) -> Result<Reading, String> {
    let reads = pods.iter().map(|(name, ip)| async move {
        let text = scrape_text(http, ip, port).await?;
        let at = |e: String| format!("http://{ip}:{port}/metrics: {e}");
        Ok::<_, String>((
            parse_exposition(&text).map_err(at)?,
            (name.clone(), latency::parse(&text).map_err(at)?),
        ))
    });
    let mut gauges = Vec::new();
    let mut counters = BTreeMap::new();
    for r in futures::future::join_all(reads).await {
        let (g, (name, c)) = r?;
        gauges.push(g);
        counters.insert(name, c);
    }
    Ok((gauges, counters))
}

/// The counters of `pods` (namespace `ns`) from the Prometheus at `base`: every pod needs its queue
/// gauge; counters and histograms without series read as zero, as in a scrape.
pub async fn query(
    http: &reqwest::Client,
    base: &str,
    ns: &str,
    pods: &[String],
) -> Result<BTreeMap<String, PodCounters>, String> {
    let selector = format!("{{namespace=\"{ns}\",pod=~\"{}\"}}", pod_regex(pods));
    let mut out: BTreeMap<String, PodCounters> = BTreeMap::new();
    let mut waiting_seen = BTreeMap::new();
    for (i, metric) in [
        names::REQUESTS,
        names::GENERATION_TOKENS,
        names::REQUESTS_WAITING,
        names::REQUESTS_RUNNING,
    ]
    .into_iter()
    .enumerate()
    {
        for (pod, v) in per_pod(http, base, &format!("sum by (pod) ({metric}{selector})")).await? {
            let v = finite(v, metric, &pod)?;
            let c = out.entry(pod.clone()).or_default();
            match i {
                0 => c.requests = v,
                1 => c.tokens = v,
                2 => {
                    c.waiting = v;
                    c.in_flight += v;
                    waiting_seen.insert(pod, ());
                }
                _ => c.in_flight += v,
            }
        }
    }
    for (i, metric) in [names::TIME_TO_FIRST_TOKEN, names::INTER_TOKEN_LATENCY]
        .into_iter()
        .enumerate()
    {
        let q = format!("sum by (pod, le) ({metric}_bucket{selector})");
        for (labels, v) in per_series(http, base, &q, &["pod", "le"]).await? {
            let v = finite(v, metric, &labels[0])?;
            let le = match labels[1].as_str() {
                "+Inf" => f64::INFINITY,
                s => s
                    .parse()
                    .map_err(|_| format!("Prometheus: {metric} bucket le={s:?} of pod {}", labels[0]))?,
            };
            let c = out.entry(labels[0].clone()).or_default();
            let buckets: &mut Buckets = if i == 0 { &mut c.ttft } else { &mut c.itl };
            buckets.add(le, v);
        }
    }
    pods.iter()
        .map(|p| match (out.remove(p), waiting_seen.contains_key(p)) {
            (Some(c), true) => Ok((p.clone(), c)),
            _ => Err(format!(
                "Prometheus has no recent {} for pod {p}",
                names::REQUESTS_WAITING
            )),
        })
        .collect()
}

fn finite(v: Option<f64>, metric: &str, pod: &str) -> Result<f64, String> {
    v.filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("Prometheus: unusable {metric} for pod {pod}"))
}
