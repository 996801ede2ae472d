//! Objectives and schedule windows in one autoscaler pass, with what the leader remembers between
//! passes ([`Sizing`]): the window of counter readings ([`Window`]), the saturated output
//! tokens/s of a replica (intervals whose queue never emptied, over [`SATURATION_WINDOW`]:
//! `capacity::measure`'s rule), the unloaded-p95 estimates of the last [`CALIBRATION_MEMORY`] (the
//! lowest is the model's `L₀`), and recent arrival rates for the trend.
//!
//! Inputs the model needs that are not metrics: the lead time ([`lead_time`]) — how long a new pod
//! takes to become Ready, measured from the deployment's own ready pods (creation to their `Ready`
//! transition, the median; [`DEFAULT_LEAD`] before any was seen), with a margin and two passes —
//! and, when this leader has not seen a replica saturated yet, `status.capacity`'s saturated figure.
//!
//! Invariants: a reading that fails leaves the memory as it was; figures in status are rounded so a
//! steady fleet compares equal; the schedule's bounds replace `minReplicas`/`maxReplicas` for the pass
//! and never touch the spec.

use super::latency::{PodCounters, Window};
use super::objectives::{self, Load, Need, Targets, Unloaded, secs};
use super::schedule;
use crate::capacity::measure::{self, History, sig3};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use modelfleet_crds::autoscaling::parse_duration;
use modelfleet_crds::model_deployment::{AutoscalingSpec, ObjectivesStatus};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// How far back saturated intervals count towards a replica's saturated throughput.
pub const SATURATION_WINDOW: Duration = Duration::from_secs(1800);
/// Least saturated replica-seconds before the figure is used: one pass's interval. A burst that
/// saturates a fresh fleet must have its μ before its first p95 over the objective scales it out (and
/// spreads the queue μ is measured on): a fleet scaled out without μ cannot size down, and a ramp run
/// of 2026-12-06 sat at 4 replicas throughout, from losing that race at 10 s. Tokens are counted
/// exactly, and one interval of a full batch is hundreds of them; more saturated intervals refine it.
pub const MIN_SATURATED_SECONDS: f64 = 3.0;
/// Lead time before a pod of the deployment was seen becoming Ready.
pub const DEFAULT_LEAD: f64 = 60.0;
/// Least span of readings before percentiles and rates are used.
pub const MIN_SPAN: Duration = Duration::from_secs(10);
/// How long an unloaded-latency estimate counts: the lowest of this span is the model's `L₀`, so a
/// slower mix (longer prompts) raises it within this long.
pub const CALIBRATION_MEMORY: Duration = Duration::from_secs(600);
/// Span the arrival and token rates are measured over.
pub const RATE_SPAN: Duration = Duration::from_secs(12);
/// Span the arrival trend is measured over.
const TREND_SPAN: Duration = Duration::from_secs(30);

/// What the leader keeps per deployment for its objectives.
#[derive(Clone, Debug, Default)]
pub struct Sizing {
    window: Window,
    saturation: History,
    mu: Option<f64>,
    /// Recent estimates of the unloaded p95s (TTFT, ITL), for [`CALIBRATION_MEMORY`].
    estimates: [VecDeque<(Instant, f64)>; 2],
    arrivals: VecDeque<(Instant, f64)>,
    /// The p95s (TTFT, ITL) of the last sizing, seconds.
    p95: [Option<f64>; 2],
}

/// The objectives in seconds; errors name the field.
pub fn targets(spec: &AutoscalingSpec) -> Result<Option<Targets>, String> {
    let Some(o) = &spec.objectives else {
        return Ok(None);
    };
    let read = |field: &str, v: &Option<String>| -> Result<Option<f64>, String> {
        v.as_deref()
            .map(|s| {
                parse_duration(s)
                    .map(|d| d.as_secs_f64())
                    .map_err(|e| format!("spec.autoscaling.objectives.{field}: {e}"))
            })
            .transpose()
    };
    Ok(Some(Targets {
        ttft: read("ttftP95", &o.ttft_p95)?,
        itl: read("itlP95", &o.itl_p95)?,
    }))
}

/// `spec` with the schedule's bounds in force at `now` (a window with `maxReplicas: 0` rests at zero:
/// at most 1 replica, 0 once idle), and the windows in force.
pub fn bounded(
    spec: &AutoscalingSpec,
    now: Timestamp,
    lead: f64,
) -> Result<(AutoscalingSpec, Vec<String>), String> {
    if spec.schedule.is_empty() {
        return Ok((spec.clone(), Vec::new()));
    }
    let s = schedule::bounds(spec, now, Duration::from_secs_f64(lead))?;
    let mut out = spec.clone();
    (out.min_replicas, out.max_replicas) = if s.max == 0 { (0, 1) } else { (s.min, s.max) };
    Ok((out, s.open))
}

/// The lead time: the median seconds from creation to Ready of `pods` that are Ready ([`ready_time`]),
/// a quarter more for a pod slower than those, and two autoscaler passes for the decision to be taken
/// and applied.
pub fn lead_time(pods: &[Pod]) -> f64 {
    ready_time(pods) * 1.25 + 2.0 * super::AUTOSCALE_INTERVAL.as_secs_f64()
}

/// The median seconds from creation to Ready of `pods` that are Ready (a pod made Ready again after a
/// restart counts from its creation, so the median, not the largest); [`DEFAULT_LEAD`] without one.
pub fn ready_time(pods: &[Pod]) -> f64 {
    let mut times: Vec<f64> = pods
        .iter()
        .filter_map(|p| {
            let created = p.metadata.creation_timestamp.as_ref()?.0;
            let ready = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")?;
            let at = ready.last_transition_time.as_ref()?.0;
            Some((at.as_second() - created.as_second()) as f64)
        })
        .filter(|s| *s >= 0.0)
        .collect();
    if times.is_empty() {
        return DEFAULT_LEAD;
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2].clamp(1.0, 1800.0)
}

impl Sizing {
    /// Adds a reading and, once the window spans [`MIN_SPAN`], sizes the fleet for `targets`; the
    /// status either way. `horizon`: seconds from a decision to a new pod serving (the lead time: the
    /// objectives' scale-ups skip the up-window); `fallback_mu`: `status.capacity`'s saturated tokens/s per replica.
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        targets: &Targets,
        window: Duration,
        counters: BTreeMap<String, PodCounters>,
        at: Instant,
        current: i32,
        horizon: f64,
        fallback_mu: Option<f64>,
    ) -> (Option<Need>, ObjectivesStatus) {
        self.saturation
            .push(saturation_sample(&counters, at), SATURATION_WINDOW);
        let replicas = counters.len() as i32;
        self.window.push(at, counters, window);
        if let Some(m) = self.saturation.measure()
            && m.saturated_replica_seconds >= MIN_SATURATED_SECONDS
        {
            self.mu = Some(m.saturated_tokens / m.saturated_replica_seconds);
        }
        let mu = self.mu.or(fallback_mu);
        let Some(t) = self.window.totals(MIN_SPAN) else {
            let status = ObjectivesStatus {
                message: format!("measuring: less than {} s of readings", MIN_SPAN.as_secs()),
                ..Default::default()
            };
            return (None, status);
        };
        // Rates from the last few readings (a 30-60 s average lags a ramp by half of it), lengths and
        // percentiles from the whole window.
        let recent = self
            .window
            .totals_within(RATE_SPAN, MIN_SPAN)
            .unwrap_or_else(|| t.clone());
        let arrival = recent.arrival_rate();
        let trend = self.trend(at, arrival);
        let load = Load {
            replicas,
            token_rate: recent.token_rate(),
            arrival_rate: arrival,
            output_tokens: if t.requests > 0.0 {
                t.tokens / t.requests
            } else {
                0.0
            },
            arrival_trend: trend,
            waiting: recent.waiting,
            ttft_p95: t.ttft.quantile(0.95),
            itl_p95: t.itl.quantile(0.95),
            recent_p95: [recent.ttft.quantile(0.95), recent.itl.quantile(0.95)],
        };
        self.p95 = [load.ttft_p95, load.itl_p95];
        let need = objectives::needed(&load, targets, mu, horizon, current, self.lowest_estimates(at));
        for (history, fresh) in self.estimates.iter_mut().zip(need.unloaded) {
            if let Some(v) = fresh {
                history.push_back((at, v));
            }
        }
        let against = |m: Option<f64>, target: Option<f64>| {
            target.map(|t| format!("{} / {}", m.map_or("-".into(), secs), secs(t)))
        };
        let status = ObjectivesStatus {
            ttft_p95: against(load.ttft_p95, targets.ttft),
            itl_p95: against(load.itl_p95, targets.itl),
            arrival_rate: Some(sig3(arrival)),
            needed_replicas: Some(need.replicas),
            schedule_windows: Vec::new(),
            message: need.why.chars().take(1000).collect(),
        };
        (Some(need), status)
    }

    /// The lowest unloaded-p95 estimates of the last [`CALIBRATION_MEMORY`] (older ones forgotten).
    fn lowest_estimates(&mut self, at: Instant) -> Unloaded {
        self.estimates.each_mut().map(|history| {
            while history
                .front()
                .is_some_and(|(t, _)| at.duration_since(*t) > CALIBRATION_MEMORY)
            {
                history.pop_front();
            }
            history.iter().map(|(_, v)| *v).reduce(f64::min)
        })
    }

    /// The measured p95s (TTFT, ITL) of the last sizing, seconds.
    pub fn p95(&self) -> [Option<f64>; 2] {
        self.p95
    }

    /// Requests/s per second over the last [`TREND_SPAN`], after recording `arrival` at `at`.
    fn trend(&mut self, at: Instant, arrival: f64) -> f64 {
        self.arrivals.push_back((at, arrival));
        while self
            .arrivals
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > TREND_SPAN)
        {
            self.arrivals.pop_front();
        }
        match self.arrivals.front() {
            Some((t, first)) if at.duration_since(*t) >= MIN_SPAN => {
                (arrival - first) / at.duration_since(*t).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

fn saturation_sample(counters: &BTreeMap<String, PodCounters>, at: Instant) -> measure::Sample {
    measure::Sample {
        at,
        pods: counters
            .iter()
            .map(|(pod, c)| {
                (
                    pod.clone(),
                    measure::PodSample {
                        tokens: c.tokens,
                        waiting: c.waiting,
                    },
                )
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaler::latency::Buckets;

    fn counters(requests: f64, tokens: f64, waiting: f64, slow: f64) -> PodCounters {
        PodCounters {
            ttft: Buckets(vec![
                (0.25, requests - slow),
                (2.5, requests),
                (f64::INFINITY, requests),
            ]),
            itl: Buckets(vec![(0.05, tokens), (f64::INFINITY, tokens)]),
            requests,
            tokens,
            in_flight: waiting,
            waiting,
        }
    }

    #[test]
    fn saturation_calibration_and_status_from_readings() {
        let targets = Targets {
            ttft: Some(1.0),
            itl: Some(0.08),
        };
        let mut s = Sizing::default();
        let t0 = Instant::now();
        let window = Duration::from_secs(60);
        let read = |r: f64, tok: f64, w: f64, slow: f64| {
            BTreeMap::from([("a".to_string(), counters(r, tok, w, slow))])
        };
        let (need, status) = s.observe(&targets, window, read(0.0, 0.0, 2.0, 0.0), t0, 1, 30.0, None);
        assert!(
            need.is_none() && status.message.starts_with("measuring"),
            "{status:?}"
        );
        // 15 s saturated (queue 2 at both ends) producing 300 tokens/s, 30 requests, 3 of them slow.
        let (need, status) = s.observe(
            &targets,
            window,
            read(30.0, 4500.0, 2.0, 3.0),
            t0 + Duration::from_secs(15),
            1,
            30.0,
            None,
        );
        let need = need.expect("sized");
        assert_eq!(s.mu, Some(300.0));
        assert_eq!(status.arrival_rate.as_deref(), Some("2.00"));
        // p95 TTFT: rank 28.5 of 30 lies 1.5/3 into (0.25, 2.5] = 1.375 s; ITL p95 within (0, 50 ms].
        assert_eq!(status.ttft_p95.as_deref(), Some("1.38s / 1.00s"));
        assert!(
            status.itl_p95.as_deref().unwrap().ends_with("/ 80ms"),
            "{status:?}"
        );
        // Saturated (ρ = 1): no calibration, no unloaded latency known: aim at 70% -> 300/210 -> 2.
        assert_eq!(need.replicas, 2, "{}", need.why);
        assert_eq!(status.needed_replicas, Some(2));
    }

    #[test]
    fn lead_time_is_the_median_ready_pod_with_margin() {
        let pod = |created: i64, ready: Option<i64>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "creationTimestamp": Timestamp::from_second(created).unwrap().to_string()},
                "status": {"conditions": ready.map(|r| vec![serde_json::json!({"type": "Ready", "status": "True",
                    "lastTransitionTime": Timestamp::from_second(r).unwrap().to_string()})]).unwrap_or_default()}
            }))
            .unwrap()
        };
        assert_eq!(ready_time(&[]), DEFAULT_LEAD);
        let pods = [
            pod(1_000, Some(1_004)),
            pod(2_000, Some(2_011)),
            pod(3_000, None),
            pod(4_000, Some(9_000)),
        ];
        assert_eq!(ready_time(&pods), 11.0, "the median of 4, 11 and 5000");
        assert_eq!(lead_time(&pods), 11.0 * 1.25 + 6.0);
    }
}
