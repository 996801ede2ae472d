//! Reading the runtime pods' metrics, shared by the autoscaler ([`crate::autoscaler::metrics`]) and
//! the capacity measurement ([`crate::capacity`]): one pod's `/metrics` text ([`scrape_text`]), the
//! samples of chosen metric names in Prometheus text exposition ([`samples`]), and one PromQL instant
//! query's value for each pod ([`per_pod`]) or each series ([`per_series`]).
//!
//! Invariants: every answer is read within [`crate::body`]'s byte caps and a timeout; a sample whose
//! value does not parse is an error in exposition text and `None` from Prometheus — never zero. Which
//! values are usable (finite, not negative) is the caller's rule.

use crate::body::{MAX_METRICS_BYTES, MAX_PROMETHEUS_BYTES, read_capped};
use std::collections::BTreeMap;
use std::time::Duration;

/// Longest a pod's `/metrics` may take to answer, body included.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest one Prometheus query may take, body included.
pub const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(5);

/// `http://<ip>:<port>/metrics` as text; errors name the URL.
pub async fn scrape_text(client: &reqwest::Client, ip: &str, port: i32) -> Result<String, String> {
    let url = format!("http://{ip}:{port}/metrics");
    let resp = client
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
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Each sample in `text` of one of `names` (matched exactly, so `x_total` is not `x`): the index of
/// its name, its value and its line; a value that does not parse is an error naming the line.
pub fn samples<'a>(
    text: &'a str,
    names: &'a [&'a str],
) -> impl Iterator<Item = Result<(usize, f64, &'a str), String>> + 'a {
    text.lines().map(str::trim).filter_map(move |line| {
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let idx = names.iter().position(|n| *n == &line[..end])?;
        let rest = &line[end..];
        // Label values may hold `}` and spaces: the value follows the last `}`.
        let value = if rest.starts_with('{') {
            rest.rfind('}').map_or("", |i| &rest[i + 1..])
        } else {
            rest
        };
        Some(
            value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .map(|v| (idx, v, line))
                .ok_or_else(|| format!("unparsable sample: {line}")),
        )
    })
}

/// PromQL's regular expression matching exactly the pod names `pods`.
pub fn pod_regex(pods: &[String]) -> String {
    pods.iter().map(|p| regex_escape(p)).collect::<Vec<_>>().join("|")
}

/// Runs the instant query `query` on the Prometheus at `base`; each series' `pod` label and its value
/// (`None` when it does not parse; NaN and ±Inf parse, and are the caller's to refuse).
pub async fn per_pod(
    client: &reqwest::Client,
    base: &str,
    query: &str,
) -> Result<BTreeMap<String, Option<f64>>, String> {
    Ok(per_series(client, base, query, &["pod"])
        .await?
        .into_iter()
        .map(|(mut labels, v)| (labels.swap_remove(0), v))
        .collect())
}

/// Runs the instant query `query`; each series' values of `labels` (empty when absent) and its value,
/// as [`per_pod`].
pub async fn per_series(
    client: &reqwest::Client,
    base: &str,
    query: &str,
    labels: &[&str],
) -> Result<Vec<(Vec<String>, Option<f64>)>, String> {
    let url = format!("{}/api/v1/query", base.trim_end_matches('/'));
    let answer = client
        .get(&url)
        .query(&[("query", query)])
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
        return Err(format!("Prometheus query {query} failed: {}", resp["error"]));
    }
    Ok(resp["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|series| {
            let values = labels
                .iter()
                .map(|l| series["metric"][l].as_str().unwrap_or_default().to_string())
                .collect();
            (values, series["value"][1].as_str().and_then(|v| v.parse().ok()))
        })
        .collect())
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                vec![c]
            } else {
                vec!['\\', c]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_of_exact_names_with_labels_timestamps_and_bad_values() {
        let text = "# TYPE a gauge\n\
                    a{x=\"1\"} 3\n\
                    a_total 99\n\
                    b{tenant=\"a} b\"} 1.5 1700000000\n\
                    c 7\n\
                    a 2\n";
        let got: Vec<(usize, f64)> = samples(text, &["a", "b"])
            .map(|s| s.map(|(i, v, _)| (i, v)))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got, vec![(0, 3.0), (1, 1.5), (0, 2.0)]);
        let bad: Vec<_> = samples("a{x=\"y\"}\n", &["a"]).collect();
        assert!(matches!(&bad[..], [Err(e)] if e.contains("a{x=\"y\"}")));
        // NaN parses: usability is the caller's rule.
        let nan: Vec<_> = samples("a NaN\n", &["a"]).collect();
        assert!(matches!(&nan[..], [Ok((0, v, _))] if v.is_nan()));
    }

    #[test]
    fn pod_names_are_escaped_for_promql() {
        assert_eq!(
            pod_regex(&["md-7d9f.x".to_string(), "b".to_string()]),
            "md-7d9f\\.x|b"
        );
    }
}
