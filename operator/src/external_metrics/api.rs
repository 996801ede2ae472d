//! The `external.metrics.k8s.io/v1beta1` wire format, pure: the metrics served, the discovery
//! document, the value list an HPA reads, the pods a metric's selector names, `Status` errors, and
//! quantities as Kubernetes writes them.
//!
//! Invariants: a metric is computed over the Ready runtime pods of exactly one ModelDeployment (its
//! selector must name it with `modelfleet.io/model-deployment`), never a namespace's sum by accident;
//! values are quantities an HPA parses (whole numbers, or thousandths with `m`).

use crate::autoscaler::decide::Sample;
use crate::labels::{APP_NAME, MODEL_DEPLOYMENT_LABEL};
use serde_json::{Value, json};

/// The API group and version served.
pub const GROUP_VERSION: &str = "external.metrics.k8s.io/v1beta1";

/// A metric served: its name and what it is over the deployment's Ready pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// `modelfleet_requests_waiting`: requests queued, summed (an HPA `AverageValue` target is then
    /// waiting requests per replica, as `targetQueueDepthPerReplica`).
    Waiting,
    /// `modelfleet_requests_running`: requests being generated, summed.
    Running,
    /// `modelfleet_kv_cache_usage_ratio`: the mean KV-cache utilisation, 0–1 (a `Value` target scales
    /// the count in proportion, as `targetKvCacheUtilization`).
    KvUsage,
}

impl Metric {
    /// Every metric, in discovery order.
    pub const ALL: [Metric; 3] = [Metric::Waiting, Metric::Running, Metric::KvUsage];

    /// Its name in the API (the runtime's metric name).
    pub fn name(self) -> &'static str {
        match self {
            Metric::Waiting => crate::autoscaler::metrics::WAITING,
            Metric::Running => crate::autoscaler::metrics::RUNNING,
            Metric::KvUsage => crate::autoscaler::metrics::KV_USAGE,
        }
    }

    /// The metric named `name`, if served.
    pub fn named(name: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Its value over the fleet `s`.
    pub fn of(self, s: &Sample) -> f64 {
        match self {
            Metric::Waiting => s.waiting,
            Metric::Running => s.running,
            Metric::KvUsage => s.kv_mean,
        }
    }
}

/// `GET /apis/external.metrics.k8s.io/v1beta1`: the metrics, as namespaced resources.
pub fn discovery() -> Value {
    let resources: Vec<Value> = Metric::ALL
        .iter()
        .map(|m| {
            json!({"name": m.name(), "singularName": "", "namespaced": true,
                   "kind": "ExternalMetricValueList", "verbs": ["get"]})
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
           "resources": resources})
}

/// The list an HPA reads: one value, at `timestamp` (RFC 3339).
pub fn value_list(metric: Metric, value: f64, deployment: &str, timestamp: &str) -> Value {
    json!({
        "kind": "ExternalMetricValueList",
        "apiVersion": GROUP_VERSION,
        "metadata": {},
        "items": [{
            "metricName": metric.name(),
            "metricLabels": {MODEL_DEPLOYMENT_LABEL: deployment},
            "timestamp": timestamp,
            "value": quantity(value),
        }],
    })
}

/// A `Status` failure with `code` and `reason` (`NotFound`, `BadRequest`, `ServiceUnavailable`).
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// A non-negative figure as a quantity: whole numbers as they are, anything else in thousandths
/// (`734m`), rounded.
pub fn quantity(value: f64) -> String {
    let milli = (value.max(0.0) * 1000.0).round() as u64;
    if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// The runtime pods a metric's `labelSelector` names, and the ModelDeployment: the selector must say
/// `modelfleet.io/model-deployment=NAME` (the HPA's `metric.selector.matchLabels`); other terms narrow
/// it further.
pub fn pod_selector(label_selector: Option<&str>) -> Result<(String, String), String> {
    let selector = label_selector.unwrap_or_default().trim();
    let deployment = selector
        .split(',')
        .map(str::trim)
        .find_map(|term| {
            let (k, v) = term.split_once("==").or_else(|| term.split_once('='))?;
            (k.trim() == MODEL_DEPLOYMENT_LABEL).then(|| v.trim().to_string())
        })
        .filter(|d| !d.is_empty())
        .ok_or_else(|| {
            format!(
                "the metric's selector must name the ModelDeployment: matchLabels {{{MODEL_DEPLOYMENT_LABEL}: NAME}} \
                 (got {selector:?})"
            )
        })?;
    Ok((
        format!("app.kubernetes.io/name={APP_NAME},{selector}"),
        deployment,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_as_kubernetes_writes_them() {
        for (v, q) in [
            (0.0, "0"),
            (7.0, "7"),
            (0.734, "734m"),
            (0.7345, "735m"),
            (2.5, "2500m"),
            (-1.0, "0"),
        ] {
            assert_eq!(quantity(v), q, "{v}");
        }
    }

    #[test]
    fn a_selector_must_name_one_deployment() {
        let (pods, md) = pod_selector(Some("modelfleet.io/model-deployment=chat")).unwrap();
        assert_eq!(md, "chat");
        assert_eq!(
            pods,
            "app.kubernetes.io/name=modelfleet-runtime,modelfleet.io/model-deployment=chat"
        );
        let (_, md) = pod_selector(Some("team=ml, modelfleet.io/model-deployment == chat")).unwrap();
        assert_eq!(md, "chat");
        for bad in [
            None,
            Some(""),
            Some("team=ml"),
            Some("modelfleet.io/model-deployment="),
        ] {
            let e = pod_selector(bad).unwrap_err();
            assert!(e.contains("must name the ModelDeployment"), "{e}");
        }
    }

    #[test]
    fn discovery_lists_every_metric_and_a_value_list_carries_one() {
        let d = discovery();
        let names: Vec<&str> = d["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "modelfleet_requests_waiting",
                "modelfleet_requests_running",
                "modelfleet_kv_cache_usage_ratio"
            ]
        );
        assert_eq!(
            Metric::named("modelfleet_requests_waiting"),
            Some(Metric::Waiting)
        );
        assert_eq!(Metric::named("cpu"), None);
        let list = value_list(Metric::KvUsage, 0.5, "chat", "2026-12-06T10:00:00Z");
        assert_eq!(list["items"][0]["value"], "500m");
        assert_eq!(
            list["items"][0]["metricLabels"]["modelfleet.io/model-deployment"],
            "chat"
        );
        let sample = Sample {
            replicas: 2,
            waiting: 5.0,
            running: 2.0,
            kv_mean: 0.25,
            ..Default::default()
        };
        let values: Vec<f64> = Metric::ALL.iter().map(|m| m.of(&sample)).collect();
        assert_eq!(values, [5.0, 2.0, 0.25]);
    }
}
