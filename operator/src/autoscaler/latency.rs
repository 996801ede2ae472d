//! What the objectives autoscaler measures: per ready replica, cumulative counters read on each pass —
//! the time-to-first-token and inter-token-latency histograms, finished requests, generated tokens —
//! and its queue ([`PodCounters`], from the pod's `/metrics`); over the last `objectives.windowSeconds`
//! their increases ([`Window::totals`]) give the fleet's p95 TTFT and ITL, its arrival rate and its
//! output tokens/s.
//!
//! Increases follow Prometheus' `increase`: per pod, the newest reading minus the oldest in the span;
//! a counter that went down restarted, and its new value is the increase; a pod that appeared within
//! the span counts from zero. Percentiles follow `histogram_quantile`: linear within the bucket that
//! holds the rank, the largest finite bound when it falls in `+Inf`.
//!
//! Invariants: a histogram or counter without series reads as zero (the runtime creates them on the
//! first observation) but a missing queue gauge is an error; a value that is not finite or is negative
//! fails the reading instead of counting as zero; a span with no finished request has no percentiles
//! (absent, never zero).

use crate::pod_metrics::samples;
use modelfleet_api::metric_names as names;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// A histogram's cumulative counts per upper bound (`le`), sorted by bound, summed over label sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets(pub Vec<(f64, f64)>);

impl Buckets {
    /// Adds `count` to the bucket bounded by `le`.
    pub fn add(&mut self, le: f64, count: f64) {
        match self.0.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += count,
            None => {
                self.0.push((le, count));
                self.0.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
    }

    /// `self − earlier` per bound (a restarted pod: `self`).
    pub(crate) fn since(&self, earlier: &Buckets) -> Buckets {
        let restarted = self
            .0
            .iter()
            .any(|(le, c)| earlier.0.iter().any(|(e_le, e)| e_le == le && e > c));
        if restarted {
            return self.clone();
        }
        Buckets(
            self.0
                .iter()
                .map(|(le, c)| {
                    let before = earlier.0.iter().find(|(b, _)| b == le).map_or(0.0, |x| x.1);
                    (*le, c - before)
                })
                .collect(),
        )
    }

    pub(crate) fn merge(&mut self, other: &Buckets) {
        for (le, c) in &other.0 {
            self.add(*le, *c);
        }
    }

    /// Observations counted (the `+Inf` bucket, or the largest).
    pub fn count(&self) -> f64 {
        self.0.last().map_or(0.0, |x| x.1)
    }

    /// The `q` quantile (0–1), as Prometheus' `histogram_quantile`; `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let (mut lower, mut below) = (0.0, 0.0);
        for &(le, cum) in &self.0 {
            if cum >= rank {
                if le.is_infinite() {
                    return Some(lower);
                }
                let inside = cum - below;
                let frac = if inside > 0.0 {
                    (rank - below) / inside
                } else {
                    1.0
                };
                return Some(lower + (le - lower) * frac);
            }
            if le.is_finite() {
                lower = le;
            }
            below = cum;
        }
        Some(lower)
    }
}

/// One replica's cumulative figures at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodCounters {
    /// `modelfleet_time_to_first_token_seconds`.
    pub ttft: Buckets,
    /// `modelfleet_inter_token_latency_seconds`.
    pub itl: Buckets,
    /// `modelfleet_requests_total` (finished requests).
    pub requests: f64,
    /// `modelfleet_generation_tokens_total`.
    pub tokens: f64,
    /// `modelfleet_requests_waiting` + `modelfleet_requests_running` now.
    pub in_flight: f64,
    /// `modelfleet_requests_waiting` now.
    pub waiting: f64,
}

const TTFT_BUCKET: &str = "modelfleet_time_to_first_token_seconds_bucket";
const ITL_BUCKET: &str = "modelfleet_inter_token_latency_seconds_bucket";

/// Reads [`PodCounters`] from Prometheus text exposition.
pub fn parse(text: &str) -> Result<PodCounters, String> {
    let wanted = [
        TTFT_BUCKET,
        ITL_BUCKET,
        names::REQUESTS,
        names::GENERATION_TOKENS,
        names::REQUESTS_WAITING,
        names::REQUESTS_RUNNING,
    ];
    let mut c = PodCounters::default();
    let mut waiting_seen = false;
    for sample in samples(text, &wanted) {
        let (idx, v, line) = sample?;
        if !v.is_finite() || v < 0.0 {
            return Err(format!("unusable sample (NaN, infinite or negative): {line}"));
        }
        match idx {
            0 | 1 => {
                let le = le_of(line).ok_or_else(|| format!("a bucket without `le`: {line}"))?;
                if idx == 0 { &mut c.ttft } else { &mut c.itl }.add(le, v);
            }
            2 => c.requests += v,
            3 => c.tokens += v,
            4 => {
                waiting_seen = true;
                c.waiting += v;
                c.in_flight += v;
            }
            _ => c.in_flight += v,
        }
    }
    if !waiting_seen {
        return Err(format!("missing metric: {}", names::REQUESTS_WAITING));
    }
    Ok(c)
}

fn le_of(line: &str) -> Option<f64> {
    let start = line.find("le=\"")? + 4;
    let end = start + line[start..].find('"')?;
    match &line[start..end] {
        "+Inf" => Some(f64::INFINITY),
        v => v.parse().ok(),
    }
}

/// The fleet's increases over a span.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Totals {
    /// Seconds between the oldest and newest readings used.
    pub seconds: f64,
    /// Requests finished.
    pub requests: f64,
    /// Tokens generated.
    pub tokens: f64,
    /// Change of requests waiting or running (arrivals not yet finished).
    pub growth: f64,
    /// Requests waiting for a batch slot at the newest reading, fleet-wide.
    pub waiting: f64,
    /// TTFT observations in the span.
    pub ttft: Buckets,
    /// Inter-token gaps in the span.
    pub itl: Buckets,
}

impl Totals {
    /// Requests arriving per second: finished plus the growth of those in flight.
    pub fn arrival_rate(&self) -> f64 {
        ((self.requests + self.growth) / self.seconds).max(0.0)
    }

    /// Tokens generated per second, fleet-wide.
    pub fn token_rate(&self) -> f64 {
        self.tokens / self.seconds
    }
}

/// The readings of the last window, oldest first.
#[derive(Clone, Debug, Default)]
pub struct Window {
    readings: VecDeque<(Instant, BTreeMap<String, PodCounters>)>,
}

impl Window {
    /// Adds a reading of every ready replica and forgets those older than `keep`.
    pub fn push(&mut self, at: Instant, pods: BTreeMap<String, PodCounters>, keep: Duration) {
        self.readings.push_back((at, pods));
        if let Some(start) = at.checked_sub(keep) {
            while self.readings.front().is_some_and(|(t, _)| *t < start) {
                self.readings.pop_front();
            }
        }
    }

    /// Increases from the oldest reading to the newest, if they are at least `min_span` apart.
    pub fn totals(&self, min_span: Duration) -> Option<Totals> {
        self.totals_within(Duration::MAX, min_span)
    }

    /// Increases over the readings of the last `span` (from the oldest within it to the newest), if
    /// they are at least `min_span` apart.
    pub fn totals_within(&self, span: Duration, min_span: Duration) -> Option<Totals> {
        let (last_at, last) = self.readings.back()?;
        let (first_at, first) = self
            .readings
            .iter()
            .find(|(t, _)| last_at.duration_since(*t) <= span)?;
        let seconds = last_at.duration_since(*first_at);
        if seconds < min_span || seconds.is_zero() {
            return None;
        }
        let mut t = Totals {
            seconds: seconds.as_secs_f64(),
            ..Totals::default()
        };
        let zero = PodCounters::default();
        for (pod, now) in last {
            let then = first.get(pod).unwrap_or(&zero);
            let restarted = now.requests < then.requests || now.tokens < then.tokens;
            let base = if restarted { &zero } else { then };
            t.requests += now.requests - base.requests;
            t.tokens += now.tokens - base.tokens;
            t.ttft.merge(&now.ttft.since(&base.ttft));
            t.itl.merge(&now.itl.since(&base.itl));
        }
        let in_flight = |r: &BTreeMap<String, PodCounters>| r.values().map(|c| c.in_flight).sum::<f64>();
        t.growth = in_flight(last) - in_flight(first);
        t.waiting = last.values().map(|c| c.waiting).sum();
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE modelfleet_time_to_first_token_seconds histogram
modelfleet_time_to_first_token_seconds_bucket{model=\"m\",tenant=\"a\",le=\"0.1\"} 50
modelfleet_time_to_first_token_seconds_bucket{model=\"m\",tenant=\"a\",le=\"0.5\"} 90
modelfleet_time_to_first_token_seconds_bucket{model=\"m\",tenant=\"a\",le=\"+Inf\"} 100
modelfleet_time_to_first_token_seconds_bucket{model=\"m\",tenant=\"b\",le=\"0.1\"} 0
modelfleet_time_to_first_token_seconds_bucket{model=\"m\",tenant=\"b\",le=\"0.5\"} 0
modelfleet_time_to_first_token_seconds_bucket{model=\"m\",tenant=\"b\",le=\"+Inf\"} 0
modelfleet_time_to_first_token_seconds_sum{model=\"m\",tenant=\"a\"} 20
modelfleet_time_to_first_token_seconds_count{model=\"m\",tenant=\"a\"} 100
modelfleet_requests_total{model=\"m\",tenant=\"a\",finish_reason=\"length\"} 100
modelfleet_generation_tokens_total{model=\"m\",tenant=\"a\"} 6400
modelfleet_requests_waiting{model=\"m\"} 2
modelfleet_requests_running{model=\"m\"} 3
";

    #[test]
    fn parses_histograms_over_tenants_and_requires_the_queue() {
        let c = parse(TEXT).unwrap();
        assert_eq!(c.ttft.0, vec![(0.1, 50.0), (0.5, 90.0), (f64::INFINITY, 100.0)]);
        assert_eq!(
            (c.requests, c.tokens, c.waiting, c.in_flight),
            (100.0, 6400.0, 2.0, 5.0)
        );
        assert!(c.itl.0.is_empty(), "no series yet: empty, not an error");
        assert!(parse("modelfleet_requests_running 1\n").is_err());
        assert!(parse("modelfleet_requests_waiting 1\nmodelfleet_requests_total NaN\n").is_err());
        assert!(
            parse("modelfleet_requests_waiting 1\nmodelfleet_time_to_first_token_seconds_bucket 3\n")
                .is_err()
        );
    }

    #[test]
    fn quantiles_as_histogram_quantile() {
        let b = Buckets(vec![(0.1, 50.0), (0.5, 90.0), (f64::INFINITY, 100.0)]);
        assert!((b.quantile(0.5).unwrap() - 0.1).abs() < 1e-12);
        // rank 85 lies 35/40 into (0.1, 0.5].
        assert!((b.quantile(0.85).unwrap() - (0.1 + 0.4 * 35.0 / 40.0)).abs() < 1e-12);
        // rank 95 is in +Inf: the largest finite bound.
        assert_eq!(b.quantile(0.95), Some(0.5));
        assert_eq!(
            Buckets(vec![(0.1, 0.0), (f64::INFINITY, 0.0)]).quantile(0.95),
            None
        );
    }

    fn pod(requests: f64, tokens: f64, fast: f64, slow: f64, in_flight: f64) -> PodCounters {
        PodCounters {
            ttft: Buckets(vec![
                (0.2, fast),
                (1.0, fast + slow),
                (f64::INFINITY, fast + slow),
            ]),
            itl: Buckets::default(),
            requests,
            tokens,
            in_flight,
            waiting: 0.0,
        }
    }

    #[test]
    fn increases_over_the_window_with_restarts_and_new_pods() {
        let t0 = Instant::now();
        let mut w = Window::default();
        let keep = Duration::from_secs(60);
        w.push(
            t0,
            BTreeMap::from([
                ("a".into(), pod(100.0, 1000.0, 100.0, 0.0, 2.0)),
                ("b".into(), pod(500.0, 9000.0, 500.0, 0.0, 0.0)),
            ]),
            keep,
        );
        assert_eq!(
            w.totals(Duration::from_secs(5)),
            None,
            "one reading spans nothing"
        );
        let later = t0 + Duration::from_secs(20);
        // a: +40 requests, 10 of them slow; b restarted (counters fell); c is new.
        w.push(
            later,
            BTreeMap::from([
                ("a".into(), pod(140.0, 1400.0, 130.0, 10.0, 4.0)),
                ("b".into(), pod(20.0, 300.0, 20.0, 0.0, 1.0)),
                ("c".into(), pod(10.0, 100.0, 0.0, 10.0, 1.0)),
            ]),
            keep,
        );
        let t = w.totals(Duration::from_secs(5)).unwrap();
        assert_eq!(
            (t.seconds, t.requests, t.tokens, t.growth),
            (20.0, 70.0, 800.0, 4.0)
        );
        assert_eq!(t.ttft.count(), 70.0);
        assert!((t.arrival_rate() - 74.0 / 20.0).abs() < 1e-12);
        // 50 fast, 20 slow: p95 at rank 66.5 is 16.5/20 into (0.2, 1.0].
        assert!((t.ttft.quantile(0.95).unwrap() - (0.2 + 0.8 * 16.5 / 20.0)).abs() < 1e-9);
        // Readings older than `keep` are forgotten: t0 goes, t0 + 20 s stays.
        w.push(t0 + Duration::from_secs(70), BTreeMap::new(), keep);
        assert_eq!(w.readings.len(), 2);
    }
}
