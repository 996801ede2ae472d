//! The operator's own observability: Prometheus metrics (reconciles, errors by reason, durations, status
//! writes, autoscaler decisions, adapter admin calls, leadership) and the `/metrics`, `/healthz`, `/readyz` endpoints.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use modelfleet_crds::model_deployment::CapacityStatus;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Metrics of the controller.
pub struct Metrics {
    registry: Registry,
    /// Reconcile passes.
    pub reconciliations: IntCounter,
    /// Failed passes, by `Error::metric_label`.
    pub errors: IntCounterVec,
    /// Duration of a pass.
    pub duration: Histogram,
    /// Status writes (a steady fleet makes none).
    pub status_writes: IntCounter,
    /// Replica changes decided by the built-in autoscaler, by direction.
    pub scaling_decisions: IntCounterVec,
    /// Admin calls to runtime pods (adapter loads and unloads), by kind and result.
    pub adapter_calls: IntCounterVec,
    /// LoraAdapter status writes.
    pub adapter_status_writes: IntCounter,
    /// 1 while this replica holds the leader Lease.
    pub leader: IntGauge,
    /// `status.capacity`'s cost per million output tokens, by `basis` (`observed`, `saturation`).
    capacity_cost: GaugeVec,
    /// `status.capacity`'s output tokens/s per replica, by `basis`.
    capacity_throughput: GaugeVec,
    /// The currency each deployment's cost series carries (to remove them exactly).
    capacity_currency: Mutex<HashMap<(String, String), String>>,
    /// p95 latency objectives and what the autoscaler measured, by `latency` (`ttft`, `itl`) and
    /// `kind` (`objective`, `measured`).
    objective_p95: GaugeVec,
    /// Seconds each phase of a runtime pod's start took (`node`, `signature`, `pull`, `verify`,
    /// `install`, `load`, `total`), observed once per pod when it turns Ready.
    pub pod_start: HistogramVec,
    /// Set once the process can serve (the API client is up).
    pub ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new();
        let reconciliations =
            IntCounter::new("modelfleet_operator_reconciliations_total", "Reconcile passes").unwrap();
        let errors = IntCounterVec::new(
            Opts::new(
                "modelfleet_operator_reconcile_errors_total",
                "Failed reconcile passes by reason",
            ),
            &["reason"],
        )
        .unwrap();
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "modelfleet_operator_reconcile_duration_seconds",
                "Duration of reconcile passes",
            )
            .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
        )
        .unwrap();
        let status_writes = IntCounter::new(
            "modelfleet_operator_status_writes_total",
            "ModelDeployment status writes",
        )
        .unwrap();
        let scaling_decisions = IntCounterVec::new(
            Opts::new(
                "modelfleet_operator_scaling_decisions_total",
                "Replica changes by the built-in autoscaler",
            ),
            &["direction"],
        )
        .unwrap();
        let adapter_calls = IntCounterVec::new(
            Opts::new(
                "modelfleet_operator_adapter_calls_total",
                "Admin calls to runtime pods by kind (load, unload) and result (ok or a condition reason)",
            ),
            &["kind", "result"],
        )
        .unwrap();
        let adapter_status_writes = IntCounter::new(
            "modelfleet_operator_adapter_status_writes_total",
            "LoraAdapter status writes",
        )
        .unwrap();
        let leader =
            IntGauge::new("modelfleet_operator_leader", "1 while this replica is the leader").unwrap();
        let capacity_cost = GaugeVec::new(
            Opts::new(
                "modelfleet_capacity_cost_per_million_output_tokens",
                "Cost per million output tokens as in status.capacity (leader only), observed or at saturation",
            ),
            &["namespace", "model_deployment", "currency", "basis"],
        )
        .unwrap();
        let capacity_throughput = GaugeVec::new(
            Opts::new(
                "modelfleet_capacity_output_tokens_per_second_per_replica",
                "Output tokens/s per replica as in status.capacity (leader only), observed or at saturation",
            ),
            &["namespace", "model_deployment", "basis"],
        )
        .unwrap();
        let objective_p95 = GaugeVec::new(
            Opts::new(
                "modelfleet_objective_p95_seconds",
                "p95 latency objectives of spec.autoscaling.objectives and the p95 the autoscaler measured (leader only)",
            ),
            &["namespace", "model_deployment", "latency", "kind"],
        )
        .unwrap();
        let pod_start = HistogramVec::new(
            HistogramOpts::new(
                "modelfleet_operator_pod_start_seconds",
                "Seconds each phase of a runtime pod's start took (node: images and image volumes; the fetch \
                 container's signature, pull, verify, install; load: the runtime to Ready; total), once per pod",
            )
            .buckets(vec![0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0]),
            &["phase"],
        )
        .unwrap();
        for c in [
            Box::new(reconciliations.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(pod_start.clone()),
            Box::new(errors.clone()),
            Box::new(duration.clone()),
            Box::new(status_writes.clone()),
            Box::new(scaling_decisions.clone()),
            Box::new(adapter_calls.clone()),
            Box::new(adapter_status_writes.clone()),
            Box::new(leader.clone()),
            Box::new(capacity_cost.clone()),
            Box::new(capacity_throughput.clone()),
            Box::new(objective_p95.clone()),
        ] {
            registry.register(c).unwrap();
        }
        Metrics {
            registry,
            reconciliations,
            errors,
            duration,
            status_writes,
            scaling_decisions,
            adapter_calls,
            adapter_status_writes,
            leader,
            capacity_cost,
            capacity_throughput,
            capacity_currency: Mutex::default(),
            objective_p95,
            pod_start,
            ready: AtomicBool::new(false),
        }
    }
}

impl Metrics {
    /// Publishes a deployment's capacity figures (the ones in its status).
    pub fn set_capacity(&self, ns: &str, name: &str, c: &CapacityStatus) {
        self.clear_capacity(ns, name);
        self.capacity_currency
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((ns.into(), name.into()), c.currency.clone());
        let num = |s: &Option<String>| s.as_deref().and_then(|v| v.parse::<f64>().ok());
        let costs = c.cost_per_million_output_tokens.clone().unwrap_or_default();
        for (basis, cost, rate) in [
            (
                "observed",
                &costs.observed,
                &c.output_tokens_per_second_per_replica,
            ),
            (
                "saturation",
                &costs.at_saturation,
                &c.saturated_output_tokens_per_second_per_replica,
            ),
        ] {
            if let Some(v) = num(cost) {
                self.capacity_cost
                    .with_label_values(&[ns, name, &c.currency, basis])
                    .set(v);
            }
            if let Some(v) = num(rate) {
                self.capacity_throughput
                    .with_label_values(&[ns, name, basis])
                    .set(v);
            }
        }
    }

    /// Removes a deployment's capacity series (no `spec.cost`, or deleted).
    pub fn clear_capacity(&self, ns: &str, name: &str) {
        let currency = self
            .capacity_currency
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ns.to_string(), name.to_string()));
        for basis in ["observed", "saturation"] {
            if let Some(c) = &currency {
                let _ = self.capacity_cost.remove_label_values(&[ns, name, c, basis]);
            }
            let _ = self.capacity_throughput.remove_label_values(&[ns, name, basis]);
        }
    }

    /// Publishes a deployment's objectives and measured p95s: (latency, objective, measured) in
    /// seconds; a figure that is absent has no series.
    pub fn set_objectives(&self, ns: &str, name: &str, figures: &[(&str, Option<f64>, Option<f64>)]) {
        self.clear_objectives(ns, name);
        for (latency, objective, measured) in figures {
            for (kind, v) in [("objective", objective), ("measured", measured)] {
                if let Some(v) = v {
                    self.objective_p95
                        .with_label_values(&[ns, name, latency, kind])
                        .set(*v);
                }
            }
        }
    }

    /// Removes a deployment's objective series (no objectives, or deleted).
    pub fn clear_objectives(&self, ns: &str, name: &str) {
        for latency in ["ttft", "itl"] {
            for kind in ["objective", "measured"] {
                let _ = self.objective_p95.remove_label_values(&[ns, name, latency, kind]);
            }
        }
    }

    /// Prometheus text of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .unwrap();
        String::from_utf8(buf).unwrap()
    }
}

/// The HTTP endpoints.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move { m.render() }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(m): State<Arc<Metrics>>| async move {
                if m.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
                }
            }),
        )
        .with_state(metrics)
}
