//! The arithmetic of `status.capacity`, pure: samples of each ready replica's output-token counter and
//! queue depth in, throughput per replica (observed and at saturation), utilisation and cost per
//! million output tokens out.
//!
//! Over the window (consecutive samples of the same pod; a counter that went down restarted, and its new
//! value is the interval's tokens, as Prometheus' `increase` counts it):
//! - output tokens = Σ token deltas; replica-seconds = Σ interval lengths (per pod);
//! - observed tokens/s per replica = tokens ÷ replica-seconds;
//! - saturated tokens/s per replica = the same over the intervals whose pod had requests waiting at both
//!   ends (its queue never emptied, so it produced all it could);
//! - utilisation = observed ÷ saturated;
//! - cost per million output tokens: observed = price × replica-seconds ÷ 3600 ÷ tokens × 10⁶; at
//!   saturation = price ÷ 3600 ÷ saturated tokens/s × 10⁶ (so observed = at saturation ÷ utilisation).
//!
//! Invariants: figures are rounded to 3 significant digits (rates, costs) or whole units, so two
//! measurements of a steady fleet compare equal more often than not; a window with no tokens has no
//! observed cost, one never saturated has no saturated figures — absent, not zero or infinite.
//!
//! Design: "the hourly price divided by the tokens actually produced per hour, measured under real
//! batching and utilisation rather than at peak" — so both figures are reported, and their ratio.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use modelfleet_crds::model_deployment::{CapacityStatus, CostFigures};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// One replica at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PodSample {
    /// `modelfleet_generation_tokens_total`, summed over tenants.
    pub tokens: f64,
    /// `modelfleet_requests_waiting`.
    pub waiting: f64,
}

/// Every ready replica at one instant, by pod name.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// When it was read.
    pub at: Instant,
    /// Per pod.
    pub pods: BTreeMap<String, PodSample>,
}

/// The samples within the window, oldest first.
#[derive(Clone, Debug, Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

/// Totals over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measurement {
    /// Seconds from the first sample to the last.
    pub span: f64,
    /// Pods in the last sample.
    pub replicas: usize,
    /// Tokens produced.
    pub tokens: f64,
    /// Σ per-pod interval lengths.
    pub replica_seconds: f64,
    /// Tokens produced in saturated intervals.
    pub saturated_tokens: f64,
    /// Σ saturated interval lengths.
    pub saturated_replica_seconds: f64,
}

impl History {
    /// Adds a sample and forgets those older than `window` before it.
    pub fn push(&mut self, sample: Sample, window: Duration) {
        let start = sample.at.checked_sub(window);
        self.samples.push_back(sample);
        if let Some(start) = start {
            while self.samples.front().is_some_and(|s| s.at < start) {
                self.samples.pop_front();
            }
        }
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The totals over the held samples (none with fewer than two).
    pub fn measure(&self) -> Option<Measurement> {
        let (first, last) = (self.samples.front()?, self.samples.back()?);
        if self.samples.len() < 2 {
            return None;
        }
        let mut m = Measurement {
            span: (last.at - first.at).as_secs_f64(),
            replicas: last.pods.len(),
            ..Measurement::default()
        };
        for (a, b) in self.samples.iter().zip(self.samples.iter().skip(1)) {
            let dt = (b.at - a.at).as_secs_f64();
            for (pod, pb) in &b.pods {
                let Some(pa) = a.pods.get(pod) else { continue };
                let delta = if pb.tokens >= pa.tokens {
                    pb.tokens - pa.tokens
                } else {
                    pb.tokens
                };
                m.tokens += delta;
                m.replica_seconds += dt;
                if pa.waiting > 0.0 && pb.waiting > 0.0 {
                    m.saturated_tokens += delta;
                    m.saturated_replica_seconds += dt;
                }
            }
        }
        Some(m)
    }
}

/// `x` with 3 significant digits, as a decimal string without exponent ("1230", "45.6", "0.0123").
pub fn sig3(x: f64) -> String {
    if !x.is_finite() || x == 0.0 {
        return "0".into();
    }
    let magnitude = x.abs().log10().floor() as i32;
    let decimals = (2 - magnitude).max(0) as usize;
    let scale = 10f64.powi(2 - magnitude);
    let rounded = (x * scale).round() / scale;
    format!("{rounded:.decimals$}")
}

impl Measurement {
    /// The status figures for a replica price of `price` per hour in `currency`, computed at `now`.
    pub fn status(&self, price: f64, currency: &str, now: Timestamp) -> CapacityStatus {
        let observed_rate = (self.replica_seconds > 0.0).then(|| self.tokens / self.replica_seconds);
        let saturated_rate = (self.saturated_replica_seconds > 0.0 && self.saturated_tokens > 0.0)
            .then(|| self.saturated_tokens / self.saturated_replica_seconds);
        let observed_cost =
            (self.tokens > 0.0).then(|| price * self.replica_seconds / 3600.0 / self.tokens * 1e6);
        let saturated_cost = saturated_rate.map(|r| price / 3600.0 / r * 1e6);
        let utilization = match (observed_rate, saturated_rate) {
            (Some(o), Some(s)) => Some((o / s * 100.0).round().clamp(0.0, 100.0) as i32),
            _ => None,
        };
        let costs = CostFigures {
            observed: observed_cost.map(sig3),
            at_saturation: saturated_cost.map(sig3),
        };
        CapacityStatus {
            replicas: self.replicas as i32,
            window_seconds: self.span.round() as i64,
            replica_seconds: self.replica_seconds.round() as i64,
            output_tokens: self.tokens.round() as i64,
            output_tokens_per_second_per_replica: observed_rate.map(sig3),
            saturated_output_tokens_per_second_per_replica: saturated_rate.map(sig3),
            saturated_replica_seconds: self.saturated_replica_seconds.round() as i64,
            utilization_percent: utilization,
            cost_per_million_output_tokens: (costs != CostFigures::default()).then_some(costs),
            currency: currency.into(),
            time: Some(Time(now)),
        }
    }
}

/// Whether two statuses carry the same figures (their computation times aside).
pub fn same_figures(a: &CapacityStatus, b: &CapacityStatus) -> bool {
    CapacityStatus {
        time: None,
        ..a.clone()
    } == CapacityStatus {
        time: None,
        ..b.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t0: Instant, secs: u64, pods: &[(&str, f64, f64)]) -> Sample {
        Sample {
            at: t0 + Duration::from_secs(secs),
            pods: pods
                .iter()
                .map(|(p, tokens, waiting)| {
                    (
                        p.to_string(),
                        PodSample {
                            tokens: *tokens,
                            waiting: *waiting,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn three_significant_digits() {
        for (x, s) in [
            (1234.5, "1230"),
            (45.64, "45.6"),
            (0.012345, "0.0123"),
            (7.0, "7.00"),
            (999.6, "1000"),
            (0.0, "0"),
            (f64::INFINITY, "0"),
        ] {
            assert_eq!(sig3(x), s, "{x}");
        }
    }

    #[test]
    fn hand_computed_window() {
        let t0 = Instant::now();
        let mut h = History::default();
        let w = Duration::from_secs(600);
        // Pod a: busy (queue non-empty) for the first 20 s at 50 tok/s, then idle for 20 s.
        // Pod b: idle throughout but for 100 tokens. Pod c appears at 30 s (no interval until 40 s).
        h.push(sample(t0, 0, &[("a", 0.0, 3.0), ("b", 0.0, 0.0)]), w);
        h.push(sample(t0, 10, &[("a", 500.0, 2.0), ("b", 100.0, 0.0)]), w);
        h.push(sample(t0, 20, &[("a", 1000.0, 1.0), ("b", 100.0, 0.0)]), w);
        h.push(
            sample(t0, 30, &[("a", 1000.0, 0.0), ("b", 100.0, 0.0), ("c", 7.0, 0.0)]),
            w,
        );
        h.push(
            sample(t0, 40, &[("a", 1000.0, 0.0), ("b", 100.0, 0.0), ("c", 7.0, 0.0)]),
            w,
        );
        let m = h.measure().unwrap();
        assert_eq!(m.span, 40.0);
        assert_eq!(m.replicas, 3);
        assert_eq!(m.tokens, 1100.0);
        assert_eq!(m.replica_seconds, 40.0 + 40.0 + 10.0);
        assert_eq!((m.saturated_tokens, m.saturated_replica_seconds), (1000.0, 20.0));
        // At $3.60 per replica-hour: 90 replica-seconds cost $0.09 for 1,100 tokens = $81.8/Mtok;
        // saturated 50 tok/s per replica = 180,000 tokens for $3.60 = $20.0/Mtok; utilisation
        // (1100/90) / 50 = 24.4%.
        let st = m.status(3.6, "USD", Timestamp::UNIX_EPOCH);
        let costs = st.cost_per_million_output_tokens.clone().unwrap();
        assert_eq!(costs.observed.as_deref(), Some("81.8"));
        assert_eq!(costs.at_saturation.as_deref(), Some("20.0"));
        assert_eq!(st.utilization_percent, Some(24));
        assert_eq!(st.output_tokens_per_second_per_replica.as_deref(), Some("12.2"));
        assert_eq!(
            st.saturated_output_tokens_per_second_per_replica.as_deref(),
            Some("50.0")
        );
        assert_eq!(
            (st.window_seconds, st.replica_seconds, st.output_tokens),
            (40, 90, 1100)
        );
    }

    #[test]
    fn restarts_windows_and_empty_figures() {
        let t0 = Instant::now();
        let w = Duration::from_secs(60);
        let mut h = History::default();
        assert!(h.measure().is_none());
        h.push(sample(t0, 0, &[("a", 900.0, 1.0)]), w);
        assert!(h.measure().is_none(), "one sample is no interval");
        // The counter went down: the container restarted; its 40 tokens are the interval's.
        h.push(sample(t0, 10, &[("a", 40.0, 1.0)]), w);
        assert_eq!(h.measure().unwrap().tokens, 40.0);
        // Samples older than the window are forgotten.
        h.push(sample(t0, 65, &[("a", 40.0, 0.0)]), w);
        assert_eq!(h.len(), 2);
        let m = h.measure().unwrap();
        assert_eq!((m.span, m.tokens), (55.0, 0.0));
        // No tokens: no observed cost, no saturated figures, nothing infinite.
        let st = m.status(2.0, "EUR", Timestamp::UNIX_EPOCH);
        assert_eq!(st.cost_per_million_output_tokens, None);
        assert_eq!(st.saturated_output_tokens_per_second_per_replica, None);
        assert_eq!(st.utilization_percent, None);
        assert_eq!(st.output_tokens_per_second_per_replica.as_deref(), Some("0"));
    }

    #[test]
    fn same_figures_ignores_the_time() {
        let m = Measurement {
            span: 30.0,
            replicas: 1,
            tokens: 10.0,
            replica_seconds: 30.0,
            ..Default::default()
        };
        let a = m.status(1.0, "USD", Timestamp::UNIX_EPOCH);
        let b = m.status(1.0, "USD", Timestamp::now());
        assert!(same_figures(&a, &b));
        let c = Measurement { tokens: 11.0, ..m }.status(1.0, "USD", Timestamp::UNIX_EPOCH);
        assert!(!same_figures(&a, &c));
    }
}
