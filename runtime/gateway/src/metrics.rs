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

/// Inter-token latency buckets: 1 ms to 10 s.
pub const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0,
];

/// Labels of the per-revision metrics.
const REVISION_LABELS: &[&str] = &["namespace", "model_deployment", "revision"];

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
    /// `modelfleet_gateway_fallbacks_total{namespace,model_deployment,target,reason,result}`.
    pub fallbacks: IntCounterVec,
    /// Per revision, what the canary analysis reads.
    pub revisions: RevisionMetrics,
}

/// The rollout metrics: per revision of a deployment (two at a time during a rollout; series of a
/// retired revision stay until the gateway restarts).
pub struct RevisionMetrics {
    /// `modelfleet_gateway_revision_requests_total{namespace,model_deployment,revision,outcome,mirrored}`.
    pub requests: IntCounterVec,
    /// `modelfleet_gateway_revision_ttft_seconds{namespace,model_deployment,revision}`.
    pub ttft: HistogramVec,
    /// `modelfleet_gateway_revision_itl_seconds{namespace,model_deployment,revision}`.
    pub itl: HistogramVec,
    /// `modelfleet_gateway_revision_route_total{namespace,model_deployment,revision,reason}`.
    pub route: IntCounterVec,
    /// `modelfleet_gateway_mirror_dropped_total{namespace,model_deployment,reason}`.
    pub mirror_dropped: IntCounterVec,
}

impl RevisionMetrics {
    fn new() -> RevisionMetrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let histogram = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
                .expect("valid metric")
        };
        RevisionMetrics {
            requests: counter(
                names::GATEWAY_REVISION_REQUESTS,
                "Requests a revision answered (mirrored copies too): ok, or error (a 5xx answer, or a \
             connection or stream that broke or went silent before the answer was complete)",
                &["namespace", "model_deployment", "revision", "outcome", "mirrored"],
            ),
            ttft: histogram(
                names::GATEWAY_REVISION_TTFT,
                "From sending a request to a pod of the revision to its first body byte (2xx answers, \
             mirrored copies too)",
                TTFT_BUCKETS,
                REVISION_LABELS,
            ),
            itl: histogram(
                names::GATEWAY_REVISION_ITL,
                "Between consecutive SSE data events of the revision's streamed answers (mirrored copies too)",
                ITL_BUCKETS,
                REVISION_LABELS,
            ),
            route: counter(
                names::GATEWAY_REVISION_ROUTE,
                "Pods chosen by revision during a rollout: weight (the revision the split chose), fallback \
             (it had no pod to try)",
                &["namespace", "model_deployment", "revision", "reason"],
            ),
            mirror_dropped: counter(
                names::GATEWAY_MIRROR_DROPPED,
                "Mirrored copies not sent: full (too many copies in flight), no_pod (no canary pod to try)",
                &["namespace", "model_deployment", "reason"],
            ),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.requests.clone()),
            Box::new(self.ttft.clone()),
            Box::new(self.itl.clone()),
            Box::new(self.route.clone()),
            Box::new(self.mirror_dropped.clone()),
        ]
    }
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
        let histogram = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
                .expect("valid metric")
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
            upstream_ttft: histogram(
                names::GATEWAY_UPSTREAM_TTFT,
                "From sending a request to a pod to its first body byte",
                TTFT_BUCKETS,
                &["model_deployment"],
            ),
            inflight: gauge(names::GATEWAY_INFLIGHT, "Requests in flight per pod", &["pod"]),
            fallbacks: counter(
                names::GATEWAY_FALLBACKS,
                "Requests spec.fallback moved from a deployment to a target (result moved), or could not \
                 (no_deployment, other_tenant, limited), by reason: no_ready_replica or saturated",
                &["namespace", "model_deployment", "target", "reason", "result"],
            ),
            revisions: RevisionMetrics::new(),
        };
        for c in [
            &m.requests,
            &m.route,
            &m.retries,
            &m.upstream_resets,
            &m.fallbacks,
        ] {
            m.registry.register(Box::new(c.clone())).expect("unique");
        }
        for g in [&m.pending, &m.inflight] {
            m.registry.register(Box::new(g.clone())).expect("unique");
        }
        m.registry
            .register(Box::new(m.upstream_ttft.clone()))
            .expect("unique");
        for c in m.revisions.collectors() {
            m.registry.register(c).expect("unique");
        }
        let traces = modelfleet_telemetry::metrics::TraceMetrics::default();
        m.registry.register(Box::new(traces)).expect("unique");
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
