//! Reading the autoscaler's inputs: `modelfleet_requests_waiting`, `modelfleet_requests_running` and
//! `modelfleet_kv_cache_usage_ratio` of each ready runtime pod, either by scraping its `/metrics`
//! (`Direct`) or through the Prometheus HTTP API (`Prometheus`, with `max_over_time` so short bursts count).
//!
//! Invariants: a pass yields a [`Sample`] only when every ready pod answered with a usable figure for
//! each metric — present, finite and not negative, from either source; anything else (silence, NaN,
//! ±Inf, a negative gauge) counts as missing and the caller holds (`ScalingActive=False`, no
//! scale-down on missing data). Answers are read within a byte cap and a timeout
//! ([`crate::pod_metrics`]).

use super::decide::Sample;
use crate::pod_metrics::{per_pod, pod_regex, samples, scrape_text};
use std::collections::BTreeMap;

/// Metric names, as the runtime exports them (docs/design.md).
pub const WAITING: &str = "modelfleet_requests_waiting";
/// Requests being generated.
pub const RUNNING: &str = "modelfleet_requests_running";
/// KV blocks referenced by live requests ÷ total.
pub const KV_USAGE: &str = "modelfleet_kv_cache_usage_ratio";

/// The HTTP client for scrapes and PromQL (installs the process-wide rustls provider if none is).
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .build()
        .expect("HTTP client with the ring provider")
}

/// One pod's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodMetrics {
    /// Waiting requests (summed over label sets).
    pub waiting: f64,
    /// Running requests (summed over label sets).
    pub running: f64,
    /// KV-cache utilisation (the largest over label sets).
    pub kv: f64,
}

/// Extracts our three metrics from Prometheus text exposition. Missing metrics are an error: a runtime
/// that does not export them cannot be autoscaled, and silence must not read as "idle".
pub fn parse_exposition(text: &str) -> Result<PodMetrics, String> {
    let mut seen = [false; 3];
    let mut m = PodMetrics::default();
    for sample in samples(text, &[WAITING, RUNNING, KV_USAGE]) {
        let (idx, value, line) = sample?;
        if usable(Some(value)).is_none() {
            return Err(format!("unusable sample (NaN, infinite or negative): {line}"));
        }
        seen[idx] = true;
        match idx {
            0 => m.waiting += value,
            1 => m.running += value,
            _ => m.kv = m.kv.max(value),
        }
    }
    let missing: Vec<&str> = [WAITING, RUNNING, KV_USAGE]
        .iter()
        .zip(seen)
        .filter(|(_, s)| !s)
        .map(|(n, _)| *n)
        .collect();
    if missing.is_empty() {
        Ok(m)
    } else {
        Err(format!("missing metrics: {}", missing.join(", ")))
    }
}

/// A figure the autoscaler may act on: present, finite and not negative (queue depths, running
/// requests and a usage ratio can be none of NaN, ±Inf or below zero).
pub fn usable(value: Option<f64>) -> Option<f64> {
    value.filter(|v| v.is_finite() && *v >= 0.0)
}

/// Combines per-pod figures into a fleet sample.
pub fn aggregate(pods: &[PodMetrics]) -> Option<Sample> {
    if pods.is_empty() {
        return None;
    }
    Some(Sample {
        replicas: pods.len() as i32,
        waiting: pods.iter().map(|p| p.waiting).sum(),
        running: pods.iter().map(|p| p.running).sum(),
        kv_mean: pods.iter().map(|p| p.kv).sum::<f64>() / pods.len() as f64,
        objectives: None,
        lead: None,
    })
}

/// Scrapes `http://<ip>:<port>/metrics` of every pod; fails if any pod fails.
pub async fn scrape_direct(
    client: &reqwest::Client,
    pod_ips: &[String],
    port: i32,
) -> Result<Vec<PodMetrics>, String> {
    let scrapes = pod_ips.iter().map(|ip| async move {
        let text = scrape_text(client, ip, port).await?;
        parse_exposition(&text).map_err(|e| format!("http://{ip}:{port}/metrics: {e}"))
    });
    futures::future::join_all(scrapes).await.into_iter().collect()
}

/// Reads the metrics of `pods` (namespace `ns`) from Prometheus, assuming the usual `namespace` and `pod`
/// target labels of Kubernetes pod discovery. Every pod must have all three series.
pub async fn query_prometheus(
    client: &reqwest::Client,
    base: &str,
    ns: &str,
    pods: &[String],
    window_secs: i32,
) -> Result<Vec<PodMetrics>, String> {
    let pod_re = pod_regex(pods);
    let mut by_pod: BTreeMap<String, [Option<f64>; 3]> = BTreeMap::new();
    for (i, (metric, agg)) in [(WAITING, "sum"), (RUNNING, "sum"), (KV_USAGE, "max")]
        .into_iter()
        .enumerate()
    {
        let query = format!(
            "{agg} by (pod) (max_over_time({metric}{{namespace=\"{ns}\",pod=~\"{pod_re}\"}}[{window_secs}s]))"
        );
        for (pod, value) in per_pod(client, base, &query).await? {
            // Prometheus writes NaN, +Inf, -Inf as strings too: they parse, and are not usable.
            by_pod.entry(pod).or_default()[i] = usable(value);
        }
    }
    pods.iter()
        .map(|p| match by_pod.get(p) {
            Some([Some(waiting), Some(running), Some(kv)]) => Ok(PodMetrics {
                waiting: *waiting,
                running: *running,
                kv: *kv,
            }),
            _ => Err(format!(
                "Prometheus has no recent usable {WAITING}/{RUNNING}/{KV_USAGE} for pod {p} (missing, NaN, infinite or negative)"
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_runtime_exposition() {
        let text = "# HELP modelfleet_requests_waiting Requests waiting.\n\
                    # TYPE modelfleet_requests_waiting gauge\n\
                    modelfleet_requests_waiting{model=\"m\",tenant=\"a\"} 3\n\
                    modelfleet_requests_waiting{model=\"m\",tenant=\"b\"} 2\n\
                    modelfleet_requests_running{model=\"m\"} 7\n\
                    modelfleet_requests_waiting_total 99\n\
                    modelfleet_kv_cache_usage_ratio{model=\"m\"} 0.42\n\
                    vllm:num_requests_waiting{model_name=\"m\"} 5\n";
        assert_eq!(
            parse_exposition(text).unwrap(),
            PodMetrics {
                waiting: 5.0,
                running: 7.0,
                kv: 0.42
            }
        );
    }

    #[test]
    fn label_values_with_braces_and_spaces() {
        let text = "modelfleet_requests_waiting{tenant=\"a} b\"} 1 1700000000\n\
                    modelfleet_requests_running 0\nmodelfleet_kv_cache_usage_ratio 0\n";
        assert_eq!(parse_exposition(text).unwrap().waiting, 1.0);
    }

    #[test]
    fn missing_or_bad_metrics_are_errors() {
        let err = parse_exposition("modelfleet_requests_waiting 1\n").unwrap_err();
        assert!(
            err.contains("modelfleet_requests_running") && err.contains("modelfleet_kv_cache_usage_ratio")
        );
        assert!(parse_exposition("modelfleet_requests_waiting NaN\n").is_err());
        let ok = "modelfleet_requests_running 0\nmodelfleet_kv_cache_usage_ratio 0\n";
        for bad in ["NaN", "+Inf", "-Inf", "-1"] {
            let text = format!("modelfleet_requests_waiting {bad}\n{ok}");
            assert!(parse_exposition(&text).is_err(), "{bad}");
        }
        assert!(parse_exposition("modelfleet_requests_waiting{a=\"b\"}\n").is_err());
    }

    #[test]
    fn aggregates_pods() {
        let pods = [
            PodMetrics {
                waiting: 3.0,
                running: 1.0,
                kv: 0.5,
            },
            PodMetrics {
                waiting: 1.0,
                running: 2.0,
                kv: 0.1,
            },
        ];
        let s = aggregate(&pods).unwrap();
        assert_eq!((s.replicas, s.waiting, s.running), (2, 4.0, 3.0));
        assert!((s.kv_mean - 0.3).abs() < 1e-12);
        assert_eq!(aggregate(&[]), None);
    }

    /// A Prometheus whose instant queries answer `value` for pod `p-0` (and 1 for `p-1`).
    async fn prometheus(value: &'static str) -> String {
        let query = move |q: axum::extract::Query<std::collections::HashMap<String, String>>| async move {
            let _ = &q.0["query"];
            axum::Json(
                serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"pod": "p-0"}, "value": [1.7e9, value]},
                {"metric": {"pod": "p-1"}, "value": [1.7e9, "1"]}]}}),
            )
        };
        crate::testing::serve(axum::Router::new().route("/api/v1/query", axum::routing::get(query))).await
    }

    #[tokio::test]
    async fn prometheus_nan_infinite_or_negative_counts_as_missing() {
        let http = http_client();
        let pods = ["p-0".to_string(), "p-1".to_string()];
        let base = prometheus("0.5").await;
        let got = query_prometheus(&http, &base, "ns", &pods, 6).await.unwrap();
        assert_eq!(got[0].kv, 0.5);
        for bad in ["NaN", "+Inf", "-Inf", "-2"] {
            let base = prometheus(bad).await;
            let e = query_prometheus(&http, &base, "ns", &pods, 6).await.unwrap_err();
            assert!(e.contains("usable") && e.contains("p-0"), "{bad}: {e}");
        }
        // No sample means no decision on it: the caller holds (decide's missing-metrics tests).
        assert_eq!(usable(Some(f64::NAN)), None);
        assert_eq!(usable(Some(0.0)), Some(0.0));
    }
}
