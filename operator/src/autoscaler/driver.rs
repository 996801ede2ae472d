//! The autoscaler's driver: the replica count of one reconcile pass — `spec.replicas` (External,
//! Disabled, or no autoscaling) or the built-in autoscaler's decision from fresh metrics — sampled
//! (pod scrapes or PromQL, and the gateway's demand with `minReplicas: 0`), decided ([`decide`], pure;
//! [`zero`] for going to and from zero; a scale-up held while a pod cannot be scheduled, [`hold`]),
//! and recorded with what status says about it.
//!
//! Status hygiene: observed metrics are rewritten only with a scaling decision or, when they changed
//! (rounded), at most every [`METRICS_WRITE_INTERVAL`]; the decision history is bounded. The
//! stabilization windows live in the leader's memory ([`Memory`]) and are copied into
//! `status.autoscaler` only with those writes, so a recommendation flapping at a boundary does not
//! rewrite status on every tick. A new leader resumes the candidates from status with their windows
//! restarted, which can delay a scale-down or scale-up by one window but never makes one premature.

use super::decide::{Decision, DownWindow, Sample, decide};
use super::gateway::Demand;
use super::latency::PodCounters;
use super::metrics::{aggregate, query_prometheus, scrape_direct};
use super::objectives::{Need, Targets};
use super::readings;
use super::sizing::{self, Sizing};
use super::zero;
use crate::config::GatewayPods;
use crate::labels::METRICS_PORT;
use crate::status::Scaling;
use crate::telemetry::Metrics;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use modelfleet_crds::ModelDeployment;
use modelfleet_crds::model_deployment::{
    AutoscalerState, AutoscalingMode, AutoscalingSpec, MetricsSource, ModelDeploymentStatus,
    ObjectivesStatus, ObservedMetrics, ScalingDecision,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the built-in autoscaler reads metrics.
pub const AUTOSCALE_INTERVAL: Duration = Duration::from_secs(3);

/// Most decisions kept in `status.recentDecisions`.
pub const MAX_DECISIONS: usize = 10;
/// Observed metrics are refreshed in status at most this often without a decision.
pub const METRICS_WRITE_INTERVAL: i64 = 30;
/// A deployment not read for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(900);

/// What the leader remembers per ModelDeployment between autoscaler ticks.
#[derive(Clone, Debug)]
pub struct Memory {
    /// When its metrics were last read (the autoscaler's rate limit).
    pub sampled: Instant,
    /// The authoritative stabilization-window state.
    pub state: AutoscalerState,
    /// The scale-down window's recommendations.
    pub down: DownWindow,
    /// The gateway's request counter for this deployment at the last reading (`minReplicas: 0` only):
    /// unchanged means nothing arrived.
    pub gateway_requests: Option<f64>,
    /// The gateway's count of requests moved to a fallback at the last reading: growth at 0 replicas
    /// wakes the deployment.
    pub gateway_moved: Option<f64>,
    /// The objectives' readings and calibration.
    pub sizing: Sizing,
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
    /// `status.objectives`.
    pub objectives: Option<ObjectivesStatus>,
    /// Why the count changed in this pass (for the Event), if it did.
    pub decision_reason: Option<String>,
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
        objectives: prev.objectives,
        decision_reason: None,
    }
}

/// The leader's autoscaler: per ModelDeployment its [`Memory`], and what it reads metrics with.
pub struct Autoscaler {
    memory: Mutex<HashMap<String, Memory>>,
    /// Pod scrapes, Prometheus, the gateway pods' demand.
    http: reqwest::Client,
    /// Lists the gateway pods (scale from zero).
    client: kube::Client,
    /// Where the gateway pods are.
    gateway: GatewayPods,
    /// `modelfleet_operator_scaling_decisions_total`.
    metrics: Arc<Metrics>,
}

impl Autoscaler {
    /// Nothing remembered yet.
    pub fn new(
        http: reqwest::Client,
        client: kube::Client,
        gateway: GatewayPods,
        metrics: Arc<Metrics>,
    ) -> Self {
        Autoscaler {
            memory: Mutex::new(HashMap::new()),
            http,
            client,
            gateway,
            metrics,
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, HashMap<String, Memory>> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decides the replica count for `md`: fixed by the spec, held (metrics read less than
    /// [`AUTOSCALE_INTERVAL`] ago), or sampled → decided → recorded.
    pub async fn replicas(
        &self,
        md: &ModelDeployment,
        existing: Option<&Deployment>,
        pods: &[Pod],
    ) -> Scaled {
        let prev = md.status.clone().unwrap_or_default();
        self.forget_stale();
        let (ns, name) = (md.namespace().unwrap_or_default(), md.name_any());
        let spec = match autoscaled(md) {
            Ok(spec) => spec,
            Err((reason, message)) => {
                self.metrics.clear_objectives(&ns, &name);
                return fixed(md, &prev, reason, message);
            }
        };
        if spec.objectives.is_none() {
            self.metrics.clear_objectives(&ns, &name);
        }
        let now = Timestamp::now();
        let lead = sizing::lead_time(pods);
        let (spec, windows) = match sizing::bounded(&spec, now, lead) {
            Ok(bounded) => bounded,
            Err(e) => return invalid(md, "InvalidSchedule", e),
        };
        let targets = match sizing::targets(&spec) {
            Ok(t) => t,
            Err(e) => return invalid(md, "InvalidObjectives", e),
        };
        let current = prev
            .desired_replicas
            .or_else(|| existing.and_then(|d| d.spec.as_ref()?.replicas))
            .unwrap_or(spec.min_replicas);
        let hold = Scaled {
            replicas: current.clamp(spec.min_replicas, spec.max_replicas),
            ..unchanged(md)
        };
        let key = format!("{ns}/{name}");
        let Some(state) = self.due(&key, &prev, now, hold.replicas == current) else {
            return hold;
        };
        let plan = Plan {
            spec: &spec,
            targets,
            lead,
            fallback_mu: saturated_figure(&prev),
        };
        let (sample, demand, decision, objectives) = self
            .sample_and_decide(md, &plan, pods, (&key, &state), current, now)
            .await;
        let (mut decision, held) = super::hold::hold_unplaced(decision, current, spec.min_replicas, pods);
        if !windows.is_empty() {
            decision.reason = format!(
                "{} (schedule windows in force: {})",
                decision.reason,
                windows.join(", ")
            );
        }
        if let Some(m) = self.memory().get_mut(&key) {
            m.state = decision.state.clone();
        }
        let scaling = held.unwrap_or_else(|| verdict(&sample, &demand, current));
        let objectives = (targets.is_some() || !spec.schedule.is_empty()).then(|| ObjectivesStatus {
            schedule_windows: windows,
            ..objectives.unwrap_or_default()
        });
        self.record(
            hold,
            scaling,
            &decision,
            (sample.as_ref().ok(), objectives),
            current,
            now,
        )
    }

    /// The stabilization state to decide from, when a reading is due (none within the rate limit
    /// while the count is within bounds); notes the reading in memory.
    fn due(
        &self,
        key: &str,
        prev: &ModelDeploymentStatus,
        now: Timestamp,
        in_bounds: bool,
    ) -> Option<AutoscalerState> {
        let mut memory = self.memory();
        if let Some(m) = memory.get_mut(key) {
            if m.sampled.elapsed() < AUTOSCALE_INTERVAL && in_bounds {
                return None;
            }
            m.sampled = Instant::now();
            return Some(m.state.clone());
        }
        let state = restart_windows(prev.autoscaler.clone(), now);
        memory.insert(
            key.to_owned(),
            Memory {
                sampled: Instant::now(),
                state: state.clone(),
                down: DownWindow::default(),
                gateway_requests: None,
                gateway_moved: None,
                sizing: Sizing::default(),
            },
        );
        Some(state)
    }

    /// Reads the replicas' metrics (and, with `minReplicas: 0`, the gateway's demand) and decides.
    async fn sample_and_decide(
        &self,
        md: &ModelDeployment,
        plan: &Plan<'_>,
        pods: &[Pod],
        (key, state): (&str, &AutoscalerState),
        current: i32,
        now: Timestamp,
    ) -> (
        Result<Sample, String>,
        Option<Result<Demand, String>>,
        Decision,
        Option<ObjectivesStatus>,
    ) {
        let spec = plan.spec;
        // With `minReplicas: 0`, the gateway's demand decides going to and from zero (zero.rs).
        let to_zero = spec.min_replicas == 0;
        let demand = match to_zero {
            true => Some(
                self.demand(&md.namespace().unwrap_or_default(), &md.name_any())
                    .await,
            ),
            false => None,
        };
        let demand_ok = demand.as_ref().and_then(|d| d.as_ref().ok());
        let mut objectives = None;
        let (sample, decision) = if to_zero && current == 0 {
            let previous = self.memory().get(key).and_then(|m| m.gateway_moved);
            (
                Err("scaled to zero".to_string()),
                zero::from_zero(demand_ok, previous),
            )
        } else {
            let want_counters = plan.targets.is_some();
            let sample = match read_sample(md, spec, pods, &self.http, want_counters).await {
                Ok((mut sample, Some(counters))) => {
                    let (need, status) = self.size(key, plan, counters, current);
                    sample.lead = need.as_ref().filter(|n| !n.rising).map(|_| plan.lead);
                    sample.objectives = need.map(|n| (n.replicas, n.why));
                    objectives = Some(status);
                    Ok(sample)
                }
                Ok((sample, None)) => Ok(sample),
                Err(e) => Err(e),
            };
            let mut down = self.memory().get(key).map(|m| m.down.clone()).unwrap_or_default();
            let mut decision = decide(spec, state, &mut down, current, sample.as_ref().ok(), now);
            if let Some(m) = self.memory().get_mut(key) {
                m.down = down;
            }
            if to_zero {
                let previous = self.memory().get(key).and_then(|m| m.gateway_requests);
                let idle = zero::is_idle(sample.as_ref().ok(), demand_ok, previous);
                zero::apply_idle_window(&mut decision, spec, state, idle, now);
            }
            (sample, decision)
        };
        if let Some(d) = demand_ok
            && let Some(m) = self.memory().get_mut(key)
        {
            m.gateway_requests = Some(d.requests);
            m.gateway_moved = Some(d.moved);
        }
        (sample, demand, decision, objectives)
    }

    /// Feeds a reading to the deployment's [`Sizing`] and sizes the fleet for its objectives.
    fn size(
        &self,
        key: &str,
        plan: &Plan<'_>,
        counters: BTreeMap<String, PodCounters>,
        current: i32,
    ) -> (Option<Need>, ObjectivesStatus) {
        let (Some(targets), Some(objectives)) = (&plan.targets, &plan.spec.objectives) else {
            return (None, ObjectivesStatus::default());
        };
        let window = Duration::from_secs(objectives.window_seconds.max(1) as u64);
        let mut memory = self.memory();
        let Some(m) = memory.get_mut(key) else {
            return (None, ObjectivesStatus::default());
        };
        let sized = m.sizing.observe(
            targets,
            window,
            counters,
            Instant::now(),
            current,
            plan.lead,
            plan.fallback_mu,
        );
        let [ttft, itl] = m.sizing.p95();
        let (ns, name) = key.split_once('/').unwrap_or_default();
        self.metrics.set_objectives(
            ns,
            name,
            &[("ttft", targets.ttft, ttft), ("itl", targets.itl, itl)],
        );
        sized
    }

    /// Forgets deployments not read for [`FORGET_AFTER`] (deleted, or no longer autoscaled), with their
    /// objective series.
    fn forget_stale(&self) {
        let mut memory = self.memory();
        let stale: Vec<String> = memory
            .iter()
            .filter(|(_, m)| m.sampled.elapsed() > FORGET_AFTER)
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            memory.remove(&key);
            if let Some((ns, name)) = key.split_once('/') {
                self.metrics.clear_objectives(ns, name);
            }
        }
    }

    async fn demand(&self, ns: &str, name: &str) -> Result<Demand, String> {
        zero::demand(&self.http, &self.client, &self.gateway, ns, name).await
    }

    /// The status fields of a decision: observed metrics rewritten only with a decision or when they
    /// changed and are old enough, the stabilization state with those writes, the bounded history.
    fn record(
        &self,
        hold: Scaled,
        scaling: Scaling,
        decision: &Decision,
        (sample, objectives): (Option<&Sample>, Option<ObjectivesStatus>),
        current: i32,
        now: Timestamp,
    ) -> Scaled {
        let changed = decision.replicas != current;
        let mut out = Scaled {
            replicas: decision.replicas,
            scaling,
            ..hold
        };
        let mut metrics_written = false;
        if let Some(s) = sample {
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
        // With the metrics' cadence, or at once when objectives or schedule windows come or go.
        let windows = |o: &Option<ObjectivesStatus>| o.as_ref().map(|o| o.schedule_windows.clone());
        if changed
            || metrics_written
            || out.objectives.is_none() != objectives.is_none()
            || windows(&out.objectives) != windows(&objectives)
        {
            out.objectives = objectives;
        }
        if changed {
            let direction = if decision.replicas > current { "up" } else { "down" };
            self.metrics
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
}

/// The autoscaling spec when the built-in autoscaler drives the count, else why not (reason, message).
fn autoscaled(md: &ModelDeployment) -> Result<AutoscalingSpec, (&'static str, &'static str)> {
    match &md.spec.autoscaling {
        None => Err((
            "AutoscalingDisabled",
            "no spec.autoscaling: replicas come from spec.replicas",
        )),
        Some(a) if a.mode == AutoscalingMode::Disabled => {
            Err(("AutoscalingDisabled", "autoscaling.mode is Disabled"))
        }
        Some(a) if a.mode == AutoscalingMode::External => Err((
            "ExternalAutoscaler",
            "an external autoscaler drives spec.replicas through /scale",
        )),
        Some(a) => Ok(a.clone()),
    }
}

/// `spec.replicas`, when no built-in autoscaling applies.
fn fixed(md: &ModelDeployment, prev: &ModelDeploymentStatus, reason: &str, message: &str) -> Scaled {
    Scaled {
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
        objectives: None,
        decision_reason: None,
    }
}

/// The `ScalingActive` verdict of a reading (pure).
fn verdict(
    sample: &Result<Sample, String>,
    demand: &Option<Result<Demand, String>>,
    current: i32,
) -> Scaling {
    match (sample, demand) {
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
    }
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

/// The fleet's gauges and, with `counters`, every pod's cumulative counters ([`readings`]).
async fn read_sample(
    md: &ModelDeployment,
    spec: &AutoscalingSpec,
    pods: &[Pod],
    http: &reqwest::Client,
    counters: bool,
) -> Result<(Sample, Option<BTreeMap<String, PodCounters>>), String> {
    let ready: Vec<&Pod> = pods
        .iter()
        .filter(|p| modelfleet_crds::pods::is_ready(p))
        .collect();
    if ready.is_empty() {
        return Err("no ready replicas to read metrics from".into());
    }
    let (per_pod, counters) = match spec.metrics.source {
        MetricsSource::Direct => {
            let targets: Vec<(String, String)> = ready
                .iter()
                .filter_map(|p| Some((p.name_any(), p.status.as_ref()?.pod_ip.clone()?)))
                .collect();
            if targets.len() != ready.len() {
                return Err("a ready replica has no pod IP".into());
            }
            if counters {
                let (gauges, counters) = readings::scrape(http, &targets, METRICS_PORT).await?;
                (gauges, Some(counters))
            } else {
                let ips: Vec<String> = targets.into_iter().map(|(_, ip)| ip).collect();
                (scrape_direct(http, &ips, METRICS_PORT).await?, None)
            }
        }
        MetricsSource::Prometheus => {
            let prom = spec
                .metrics
                .prometheus
                .as_ref()
                .ok_or("metrics.prometheus is not set")?;
            let names: Vec<String> = ready.iter().map(|p| p.name_any()).collect();
            let ns = md.namespace().unwrap_or_default();
            let gauges = query_prometheus(http, &prom.url, &ns, &names, prom.window_seconds).await?;
            let counters = match counters {
                true => Some(readings::query(http, &prom.url, &ns, &names).await?),
                false => None,
            };
            (gauges, counters)
        }
    };
    let sample = aggregate(&per_pod).ok_or("no metrics")?;
    Ok((sample, counters))
}

/// What a pass sizes the fleet with besides metrics.
struct Plan<'a> {
    /// The spec with the schedule's bounds in force.
    spec: &'a AutoscalingSpec,
    /// The objectives, in seconds.
    targets: Option<Targets>,
    /// Seconds for a new pod to become Ready.
    lead: f64,
    /// `status.capacity`'s saturated output tokens/s per replica.
    fallback_mu: Option<f64>,
}

/// `status.capacity`'s saturated output tokens/s per replica, if measured.
fn saturated_figure(prev: &ModelDeploymentStatus) -> Option<f64> {
    prev.capacity
        .as_ref()?
        .saturated_output_tokens_per_second_per_replica
        .as_deref()?
        .parse()
        .ok()
}

/// Holds the count, with `ScalingActive=False` for `reason` and its message (a spec the operator
/// cannot act on).
fn invalid(md: &ModelDeployment, reason: &str, message: String) -> Scaled {
    Scaled {
        scaling: Scaling {
            active: false,
            reason: reason.into(),
            message,
        },
        ..unchanged(md)
    }
}
