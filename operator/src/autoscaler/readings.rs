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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaler::metrics::http_client;
    use serde_json::{Value, json};

    /// A Prometheus answering each query by the metric it names: pod `p-0` has every series, `p-1`
    /// only what `p1_waiting` says about its queue gauge.
    async fn prometheus(p1_waiting: bool) -> String {
        let query = move |q: axum::extract::Query<std::collections::HashMap<String, String>>| async move {
            let q = q.0["query"].clone();
            let series = |pod: &str, le: Option<&str>, v: &str| -> Value {
                let mut metric = json!({"pod": pod});
                if let Some(le) = le {
                    metric["le"] = json!(le);
                }
                json!({"metric": metric, "value": [1.7e9, v]})
            };
            let result: Vec<Value> = if q.contains("_bucket") {
                let (a, b) = if q.contains("first_token") {
                    ("9", "10")
                } else {
                    ("400", "400")
                };
                vec![series("p-0", Some("0.5"), a), series("p-0", Some("+Inf"), b)]
            } else if q.contains("requests_waiting") {
                let mut r = vec![series("p-0", None, "2")];
                if p1_waiting {
                    r.push(series("p-1", None, "0"));
                }
                r
            } else if q.contains("requests_running") {
                vec![series("p-0", None, "3")]
            } else if q.contains("requests_total") {
                vec![series("p-0", None, "10")]
            } else {
                vec![series("p-0", None, "640")]
            };
            axum::Json(json!({"status": "success", "data": {"resultType": "vector", "result": result}}))
        };
        crate::testing::serve(axum::Router::new().route("/api/v1/query", axum::routing::get(query))).await
    }

    #[tokio::test]
    async fn prometheus_counters_per_pod_and_bucket() {
        let http = http_client();
        let pods = ["p-0".to_string(), "p-1".to_string()];
        let got = query(&http, &prometheus(true).await, "ns", &pods).await.unwrap();
        let p0 = &got["p-0"];
        assert_eq!(
            (p0.requests, p0.tokens, p0.waiting, p0.in_flight),
            (10.0, 640.0, 2.0, 5.0)
        );
        assert_eq!(p0.ttft.0, vec![(0.5, 9.0), (f64::INFINITY, 10.0)]);
        assert_eq!(p0.itl.count(), 400.0);
        // A pod with only its queue gauge reads as idle counters, not as missing.
        assert_eq!(got["p-1"].requests, 0.0);
        let e = query(&http, &prometheus(false).await, "ns", &pods)
            .await
            .unwrap_err();
        assert!(e.contains("p-1"), "{e}");
    }
}
