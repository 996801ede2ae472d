//! The gateway's Prometheus metrics, named in docs/design.md ("Gateway") and `modelfleet_api::
//! metric_names`. The operator scales a deployment from zero on `modelfleet_gateway_pending_requests`
//! and reads `modelfleet_gateway_requests_total` to tell an idle deployment from a busy one.
//!
//! Invariants: counters only grow; label values are namespaces, object names, tenant ids, outcomes and
//! pod names — never keys or prompts.

use modelfleet_api::metric_names as names;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Time-to-first-byte buckets: 5 ms to 10 minutes (a request held while its deployment scales from zero).
pub const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
];

/// Every metric the gateway exports.
pub struct Metrics {
    registry: Registry,
    /// `modelfleet_gateway_requests_total{namespace,model_deployment,tenant,outcome,pod}`.
    pub requests: IntCounterVec,
    /// `modelfleet_gateway_route_total{model_deployment,decision}`.
    pub route: IntCounterVec,
    /// `modelfleet_gateway_retries_total{model_deployment}`.
    pub retries: IntCounterVec,
    /// `modelfleet_gateway_upstream_resets_total{model_deployment,verdict}`.
    pub upstream_resets: IntCounterVec,
    /// `modelfleet_gateway_pending_requests{namespace,model_deployment}`.
    pub pending: IntGaugeVec,
    /// `modelfleet_gateway_upstream_ttft_seconds{model_deployment}`.
    pub upstream_ttft: HistogramVec,
    /// `modelfleet_gateway_inflight{pod}`.
    pub inflight: IntGaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let m = Metrics {
            registry: Registry::new(),
            requests: counter(
                names::GATEWAY_REQUESTS,
                "Requests answered, by deployment, tenant, outcome (ok, cancelled, stream_error, or the \
                 HTTP status) and the pod that served (empty if none)",
                &["namespace", "model_deployment", "tenant", "outcome", "pod"],
            ),
            route: counter(
                names::GATEWAY_ROUTE,
                "Routing decisions: affinity (the key's home pod), overflow (another pod: home over the \
                 bound), only (one eligible pod)",
                &["model_deployment", "decision"],
            ),
            retries: counter(
                names::GATEWAY_RETRIES,
                "Requests sent again to another pod after a failure before their first byte",
                &["model_deployment"],
            ),
            upstream_resets: counter(
                names::GATEWAY_UPSTREAM_RESETS,
                "Connections to a pod that broke after the request was sent and before its answer was \
                 complete, by whether the pod was still alive (`pod_alive`: retried once if no byte had \
                 reached the client) or had gone (`pod_gone`: never retried)",
                &["model_deployment", "verdict"],
            ),
            pending: gauge(
                names::GATEWAY_PENDING_REQUESTS,
                "Requests held while their deployment has no Ready pod (the operator scales from zero on it)",
                &["namespace", "model_deployment"],
            ),
            upstream_ttft: HistogramVec::new(
                HistogramOpts::new(
                    names::GATEWAY_UPSTREAM_TTFT,
                    "From sending a request to a pod to its first body byte",
                )
                .buckets(TTFT_BUCKETS.to_vec()),
                &["model_deployment"],
            )
            .expect("valid metric"),
            inflight: gauge(names::GATEWAY_INFLIGHT, "Requests in flight per pod", &["pod"]),
        };
        for c in [&m.requests, &m.route, &m.retries, &m.upstream_resets] {
            m.registry.register(Box::new(c.clone())).expect("unique");
        }
        for g in [&m.pending, &m.inflight] {
            m.registry.register(Box::new(g.clone())).expect("unique");
        }
        m.registry
            .register(Box::new(m.upstream_ttft.clone()))
            .expect("unique");
        m
    }

    /// Registers a further collector (the limits' metrics).
    pub fn register(&self, c: Box<dyn prometheus::core::Collector>) {
        self.registry.register(c).expect("unique");
    }

    /// Makes `id`'s retry counter and pending gauge exist (at 0) once a request names it, so dashboards
    /// and the operator read 0 rather than no series.
    pub fn touch(&self, id: &crate::fleet::DeploymentId) {
        self.retries.with_label_values(&[&id.name]);
        self.pending.with_label_values(&[&id.namespace, &id.name]);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding");
        String::from_utf8(out).expect("UTF-8 exposition")
    }
}
