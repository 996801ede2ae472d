//! The replica count of one pass: `spec.replicas` (External, Disabled, or no autoscaling) or the built-in
//! autoscaler's decision from fresh metrics, with what status records about it.
//!
//! Status hygiene: observed metrics are rewritten only with a scaling decision or, when they changed
//! (rounded), at most every [`METRICS_WRITE_INTERVAL`]; the decision history is bounded. The
//! stabilization windows live in the leader's memory ([`Memory`]) and are copied into
//! `status.autoscaler` only with those writes, so a recommendation flapping at a boundary does not
//! rewrite status on every tick. A new leader resumes the candidates from status with their windows
//! restarted, which can delay a scale-down or scale-up by one window but never makes one premature.

use super::{AUTOSCALE_INTERVAL, Context, zero};
use crate::autoscaler::decide::{Sample, decide};
use crate::autoscaler::metrics::{aggregate, query_prometheus, scrape_direct};
use crate::labels::METRICS_PORT;
use crate::status::Scaling;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use modelfleet_crds::ModelDeployment;
use modelfleet_crds::model_deployment::{
    AutoscalerState, AutoscalingMode, AutoscalingSpec, MetricsSource, ObservedMetrics, ScalingDecision,
};
use std::time::Instant;

/// Most decisions kept in `status.recentDecisions`.
pub const MAX_DECISIONS: usize = 10;
/// Observed metrics are refreshed in status at most this often without a decision.
pub const METRICS_WRITE_INTERVAL: i64 = 30;

/// What the leader remembers per ModelDeployment between autoscaler ticks.
#[derive(Clone, Debug)]
pub struct Memory {
    /// When its metrics were last read (the autoscaler's rate limit).
    pub sampled: Instant,
    /// The authoritative stabilization-window state.
    pub state: AutoscalerState,
    /// The gateway's request counter for this deployment at the last reading (`minReplicas: 0` only):
    /// unchanged means nothing arrived.
    pub gateway_requests: Option<f64>,
}

/// The outcome of the replica decision, with the status fields it owns.
#[derive(Clone, Debug)]
pub struct Scaled {
    /// Replicas to run.
    pub replicas: i32,
    /// The `ScalingActive` verdict.
    pub scaling: Scaling,
    /// `status.observedMetrics`.
    pub observed_metrics: Option<ObservedMetrics>,
    /// `status.lastScaleTime`.
    pub last_scale_time: Option<Time>,
    /// `status.recentDecisions`.
    pub recent_decisions: Vec<ScalingDecision>,
    /// `status.autoscaler`.
    pub autoscaler: Option<AutoscalerState>,
    /// Why the count changed in this pass (for the Event), if it did.
    pub decision_reason: Option<String>,
}

/// Whether `pod` is Ready and not being deleted.
pub(crate) fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The replica count and status fields as the previous pass left them (a pass that applies nothing:
/// a `NameConflict`). No metrics are read.
pub fn unchanged(md: &ModelDeployment) -> Scaled {
    let prev = md.status.clone().unwrap_or_default();
    Scaled {
        replicas: prev.desired_replicas.or(md.spec.replicas).unwrap_or(1),
        scaling: previous_scaling(&prev),
        observed_metrics: prev.observed_metrics,
        last_scale_time: prev.last_scale_time,
        recent_decisions: prev.recent_decisions,
        autoscaler: prev.autoscaler,
        decision_reason: None,
    }
}

/// Decides the replica count for `md`.
pub async fn replicas(
    md: &ModelDeployment,
    existing: Option<&Deployment>,
    pods: &[Pod],
    ctx: &Context,
) -> Scaled {
    let prev = md.status.clone().unwrap_or_default();
    let fixed = |reason: &str, message: &str| Scaled {
        replicas: md.spec.replicas.unwrap_or(1),
        scaling: Scaling {
            active: false,
            reason: reason.into(),
            message: message.into(),
        },
        observed_metrics: None,
        last_scale_time: prev.last_scale_time.clone(),
        recent_decisions: prev.recent_decisions.clone(),
        autoscaler: None,
        decision_reason: None,
    };
    let spec = match &md.spec.autoscaling {
        None => {
            return fixed(
                "AutoscalingDisabled",
                "no spec.autoscaling: replicas come from spec.replicas",
            );
        }
        Some(a) if a.mode == AutoscalingMode::Disabled => {
            return fixed("AutoscalingDisabled", "autoscaling.mode is Disabled");
        }
        Some(a) if a.mode == AutoscalingMode::External => {
            return fixed(
                "ExternalAutoscaler",
                "an external autoscaler drives spec.replicas through /scale",
            );
        }
        Some(a) => a.clone(),
    };
    let current = prev
        .desired_replicas
        .or_else(|| existing.and_then(|d| d.spec.as_ref()?.replicas))
        .unwrap_or(spec.min_replicas);
    let key = format!("{}/{}", md.namespace().unwrap_or_default(), md.name_any());
    let hold = Scaled {
        replicas: current.clamp(spec.min_replicas, spec.max_replicas),
        scaling: previous_scaling(&prev),
        observed_metrics: prev.observed_metrics.clone(),
        last_scale_time: prev.last_scale_time.clone(),
        recent_decisions: prev.recent_decisions.clone(),
        autoscaler: prev.autoscaler.clone(),
        decision_reason: None,
    };
    let now = Timestamp::now();
    let state = {
        let mut last = ctx.last_sample.lock().unwrap();
        let remembered = last.get(&key).cloned();
        if remembered
            .as_ref()
            .is_some_and(|m| m.sampled.elapsed() < AUTOSCALE_INTERVAL)
            && hold.replicas == current
        {
            return hold;
        }
        let gateway_requests = remembered.as_ref().and_then(|m| m.gateway_requests);
        let state = remembered.map_or_else(|| restart_windows(prev.autoscaler.clone(), now), |m| m.state);
        last.insert(
            key.clone(),
            Memory {
                sampled: Instant::now(),
                state: state.clone(),
                gateway_requests,
            },
        );
        state
    };

    // With `minReplicas: 0`, the gateway's demand decides going to and from zero (zero.rs).
    let to_zero = spec.min_replicas == 0;
    let demand = if to_zero {
        let ns = md.namespace().unwrap_or_default();
        Some(zero::demand(ctx, &ns, &md.name_any()).await)
    } else {
        None
    };
    let demand_ok = demand.as_ref().and_then(|d| d.as_ref().ok());
    let (sample, decision) = if to_zero && current == 0 {
        (Err("scaled to zero".to_string()), zero::from_zero(demand_ok))
    } else {
        let sample = read_sample(md, &spec, pods, ctx).await;
        let mut decision = decide(&spec, &state, current, sample.as_ref().ok(), now);
        if to_zero {
            let previous = ctx
                .last_sample
                .lock()
                .unwrap()
                .get(&key)
                .and_then(|m| m.gateway_requests);
            let idle = zero::is_idle(sample.as_ref().ok(), demand_ok, previous);
            zero::apply_idle_window(&mut decision, &spec, &state, idle, now);
        }
        (sample, decision)
    };
    if let Some(d) = demand_ok
        && let Some(m) = ctx.last_sample.lock().unwrap().get_mut(&key)
    {
        m.gateway_requests = Some(d.requests);
    }
    let scaling = match (&sample, &demand) {
        (Ok(s), _) => Scaling {
            active: true,
            reason: "MetricsAvailable".into(),
            message: format!("reading metrics of {} ready replicas", s.replicas),
        },
        (Err(_), Some(Ok(d))) if current == 0 => Scaling {
            active: true,
            reason: "ScaledToZero".into(),
            message: format!(
                "0 replicas; {} gateway pods report {} pending requests",
                d.gateways, d.pending
            ),
        },
        (Err(_), Some(Err(e))) if current == 0 => Scaling {
            active: false,
            reason: "GatewayMetricsUnavailable".into(),
            message: e.chars().take(1000).collect(),
        },
        (Err(e), _) => Scaling {
            active: false,
            reason: "MetricsUnavailable".into(),
            message: e.clone(),
        },
    };
    let changed = decision.replicas != current;
    if let Some(m) = ctx.last_sample.lock().unwrap().get_mut(&key) {
        m.state = decision.state.clone();
    }
    let mut out = Scaled {
        replicas: decision.replicas,
        scaling,
        ..hold
    };
    let mut metrics_written = false;
    if let Ok(s) = &sample {
        let fresh = observed(s, now);
        let stale = out.observed_metrics.as_ref().is_none_or(|m| {
            let age = m
                .time
                .as_ref()
                .map_or(i64::MAX, |t| now.as_second() - t.0.as_second());
            age >= METRICS_WRITE_INTERVAL && !same_figures(m, &fresh)
        });
        if changed || stale {
            out.observed_metrics = Some(fresh);
            metrics_written = true;
        }
    }
    if changed || metrics_written {
        out.autoscaler = (decision.state != AutoscalerState::default()).then_some(decision.state.clone());
    }
    if changed {
        let direction = if decision.replicas > current { "up" } else { "down" };
        ctx.metrics
            .scaling_decisions
            .with_label_values(&[direction])
            .inc();
        out.last_scale_time = Some(Time(now));
        out.recent_decisions.push(ScalingDecision {
            time: Time(now),
            from: current,
            to: decision.replicas,
            reason: decision.reason.chars().take(1000).collect(),
        });
        let excess = out.recent_decisions.len().saturating_sub(MAX_DECISIONS);
        out.recent_decisions.drain(..excess);
        out.decision_reason = Some(format!("{current} -> {}: {}", decision.replicas, decision.reason));
    }
    out
}

/// The `ScalingActive` verdict the previous status holds (`Pending` before the first read).
fn previous_scaling(prev: &modelfleet_crds::model_deployment::ModelDeploymentStatus) -> Scaling {
    prev.conditions
        .iter()
        .find(|c| c.type_ == modelfleet_crds::condition_types::SCALING_ACTIVE)
        .map_or(
            Scaling {
                active: false,
                reason: "Pending".into(),
                message: "metrics not read yet".into(),
            },
            |c| Scaling {
                active: c.status == "True",
                reason: c.reason.clone(),
                message: c.message.clone(),
            },
        )
}

/// The state a new leader resumes from status: the same candidates, their windows starting now.
fn restart_windows(persisted: Option<AutoscalerState>, now: Timestamp) -> AutoscalerState {
    let mut state = persisted.unwrap_or_default();
    for c in [&mut state.scale_up, &mut state.scale_down].into_iter().flatten() {
        c.since = Time(now);
    }
    if state.idle_since.is_some() {
        state.idle_since = Some(Time(now));
    }
    state
}

fn observed(s: &Sample, now: Timestamp) -> ObservedMetrics {
    ObservedMetrics {
        queue_depth: s.waiting.round() as i64,
        running_requests: s.running.round() as i64,
        kv_cache_utilization_percent: (s.kv_mean * 100.0).round().clamp(0.0, 100.0) as i32,
        sampled_replicas: s.replicas,
        time: Some(Time(now)),
    }
}

fn same_figures(a: &ObservedMetrics, b: &ObservedMetrics) -> bool {
    (
        a.queue_depth,
        a.running_requests,
        a.kv_cache_utilization_percent,
        a.sampled_replicas,
    ) == (
        b.queue_depth,
        b.running_requests,
        b.kv_cache_utilization_percent,
        b.sampled_replicas,
    )
}

async fn read_sample(
    md: &ModelDeployment,
    spec: &AutoscalingSpec,
    pods: &[Pod],
    ctx: &Context,
) -> Result<Sample, String> {
    let ready: Vec<&Pod> = pods.iter().filter(|p| is_ready(p)).collect();
    if ready.is_empty() {
        return Err("no ready replicas to read metrics from".into());
    }
    let per_pod = match spec.metrics.source {
        MetricsSource::Direct => {
            let ips: Vec<String> = ready
                .iter()
                .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
                .collect();
            if ips.len() != ready.len() {
                return Err("a ready replica has no pod IP".into());
            }
            scrape_direct(&ctx.http, &ips, METRICS_PORT).await?
        }
        MetricsSource::Prometheus => {
            let prom = spec
                .metrics
                .prometheus
                .as_ref()
                .ok_or("metrics.prometheus is not set")?;
            let names: Vec<String> = ready.iter().map(|p| p.name_any()).collect();
            let ns = md.namespace().unwrap_or_default();
            query_prometheus(&ctx.http, &prom.url, &ns, &names, prom.window_seconds).await?
        }
    };
    aggregate(&per_pod).ok_or_else(|| "no metrics".into())
}
