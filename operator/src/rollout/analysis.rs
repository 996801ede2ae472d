//! The analysis decision (pure): is the canary, over one window of traffic, as good as stable?
//!
//! Inputs are each revision's increases over the window — answered requests, failed ones, and the
//! TTFT and ITL histograms — as the gateway counts them per revision. The decision is one of:
//! - `Wait`: the canary answered fewer than `minRequests` (too little evidence: never a pass), the
//!   step has not yet run half a window (`settled`: the first seconds after a weight change measure
//!   queues filling on the pods that just gained traffic, not the revision — a good canary at 50 %
//!   was once failed on 52 requests of its first second), or stable has no latency to compare with yet. Stable's figures are its own window's when it answered
//!   at least `minRequests` in it, else the last such window of this rollout (a step at 100 % leaves
//!   stable only fallbacks): the caller's choice, see drive.rs;
//! - `Fail`: a threshold is exceeded, named with the figures. An error-rate failure is called as soon
//!   as it is certain — when the canary's errors so far would exceed the threshold even if every
//!   request still needed to reach `minRequests` succeeded — so a broken canary is withdrawn before
//!   the window fills;
//! - `Pass`, with the figures.
//!
//! A latency ratio fails only when the p95 is also more than [`MIN_TTFT_INCREASE`] /
//! [`MIN_ITL_INCREASE`] above stable's: sub-millisecond latencies (a tiny model, an idle fleet) have
//! ratios that are the histogram's resolution, not the model's speed.
//!
//! Invariants: latency ratios compare p95 to p95 (PromQL's `histogram_quantile`) and are judged only
//! when both revisions have observations; a canary with no latency samples but enough requests fails
//! nothing on latency (its requests all failed before a first token, which the error rate judges).

use crate::autoscaler::latency::Buckets;
use modelfleet_crds::rollout::RolloutAnalysis;

/// A p95 time to first token less than this much above stable's never fails, whatever the ratio: below
/// it the gateway's histogram (first bucket 5 ms) resolves noise, not a slower model.
pub const MIN_TTFT_INCREASE: f64 = 0.025;
/// The same for the p95 inter-token latency (histogram's first bucket 1 ms).
pub const MIN_ITL_INCREASE: f64 = 0.005;

/// One revision's traffic over the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Traffic {
    pub requests: f64,
    pub errors: f64,
    pub ttft: Buckets,
    pub itl: Buckets,
}

impl Traffic {
    fn error_percent(&self) -> f64 {
        if self.requests <= 0.0 {
            0.0
        } else {
            100.0 * self.errors / self.requests
        }
    }
}

/// `spec.rollout.analysis`, read.
#[derive(Clone, Debug, PartialEq)]
pub struct Thresholds {
    pub window_seconds: u64,
    pub min_requests: f64,
    pub max_error_points: f64,
    pub max_ttft_ratio: f64,
    pub max_itl_ratio: f64,
}

impl Thresholds {
    /// Reads the spec (defaults when absent). The schema's patterns make every decimal parse; one
    /// that does not is an error naming the field.
    pub fn from_spec(a: Option<&RolloutAnalysis>) -> Result<Self, String> {
        let a = a.cloned().unwrap_or_default();
        let decimal = |field: &str, v: &str| {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("spec.rollout.analysis.{field}: {v:?} is not a decimal"))
        };
        Ok(Self {
            window_seconds: a.window_seconds.max(1) as u64,
            min_requests: f64::from(a.min_requests.max(1)),
            max_error_points: decimal("maxErrorRateIncrease", &a.max_error_rate_increase)?,
            max_ttft_ratio: decimal("maxTtftP95Ratio", &a.max_ttft_p95_ratio)?,
            max_itl_ratio: decimal("maxItlP95Ratio", &a.max_itl_p95_ratio)?,
        })
    }
}

/// The figures a judgement rests on (what `status.rollout.steps[]` shows).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    pub canary_requests: f64,
    pub stable_requests: f64,
    pub canary_error_percent: f64,
    pub stable_error_percent: f64,
    pub ttft_ratio: Option<f64>,
    pub itl_ratio: Option<f64>,
}

/// What one look at the window concludes.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Wait(String),
    Pass(Figures),
    Fail { threshold: String, figures: Figures },
}

fn ratio(canary: &Buckets, stable: &Buckets) -> Option<f64> {
    let (c, s) = (canary.quantile(0.95)?, stable.quantile(0.95)?);
    if s > 0.0 {
        Some(c / s)
    } else if c > 0.0 {
        Some(f64::INFINITY)
    } else {
        Some(1.0)
    }
}

/// Judges the canary's window against stable's; `None`: nothing of stable's to compare with (a step
/// at 100 % without an earlier baseline), so errors are judged against 0 % and latency not at all.
pub fn judge(canary: &Traffic, stable: Option<&Traffic>, t: &Thresholds, settled: bool) -> Verdict {
    let none = Traffic::default();
    let compared = stable.is_some();
    let stable = stable.unwrap_or(&none);
    let figures = Figures {
        canary_requests: canary.requests,
        stable_requests: stable.requests,
        canary_error_percent: canary.error_percent(),
        stable_error_percent: stable.error_percent(),
        ttft_ratio: ratio(&canary.ttft, &stable.ttft),
        itl_ratio: ratio(&canary.itl, &stable.itl),
    };
    let allowed = figures.stable_error_percent + t.max_error_points;
    // The error rate the canary would have at `minRequests` if every request still to come succeeded.
    let floor = 100.0 * canary.errors / canary.requests.max(t.min_requests);
    if floor > allowed {
        return Verdict::Fail {
            threshold: format!(
                "error rate {:.2}% over {} requests exceeds stable's {:.2}% + {} points",
                figures.canary_error_percent,
                canary.requests,
                figures.stable_error_percent,
                t.max_error_points
            ),
            figures,
        };
    }
    if canary.requests < t.min_requests {
        return Verdict::Wait(format!(
            "{} of the {} canary requests needed to judge",
            canary.requests, t.min_requests
        ));
    }
    if !settled {
        return Verdict::Wait(format!(
            "latency is judged once the step has run half of its {} s window",
            t.window_seconds
        ));
    }
    let latency = [
        (
            "p95 time to first token",
            figures.ttft_ratio,
            t.max_ttft_ratio,
            &canary.ttft,
            &stable.ttft,
            MIN_TTFT_INCREASE,
        ),
        (
            "p95 inter-token latency",
            figures.itl_ratio,
            t.max_itl_ratio,
            &canary.itl,
            &stable.itl,
            MIN_ITL_INCREASE,
        ),
    ];
    for (what, measured, max, c, s, floor) in latency {
        let increase = c.quantile(0.95).unwrap_or(0.0) - s.quantile(0.95).unwrap_or(0.0);
        if let Some(r) = measured.filter(|r| *r > max && increase > floor) {
            return Verdict::Fail {
                threshold: format!(
                    "{what} is {r:.3}× stable's (+{:.0} ms), above the {max}× allowed",
                    increase * 1000.0
                ),
                figures,
            };
        }
    }
    let canary_timed = canary.ttft.count() > 0.0;
    if compared && canary_timed && stable.ttft.count() <= 0.0 {
        return Verdict::Wait("stable has no latency samples in the window to compare with".into());
    }
    Verdict::Pass(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thresholds() -> Thresholds {
        Thresholds::from_spec(None).unwrap()
    }

    /// `n` requests, `e` failed, TTFT and ITL all in the bucket ending at `ttft` / `itl` seconds.
    fn traffic(n: f64, e: f64, ttft: f64, itl: f64) -> Traffic {
        let hist = |at: f64| {
            let mut b = Buckets::default();
            for le in [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, f64::INFINITY] {
                b.add(le, if le >= at { n - e } else { 0.0 });
            }
            b
        };
        Traffic {
            requests: n,
            errors: e,
            ttft: hist(ttft),
            itl: hist(itl),
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let t = thresholds();
        assert_eq!(
            (
                t.window_seconds,
                t.min_requests,
                t.max_error_points,
                t.max_ttft_ratio,
                t.max_itl_ratio
            ),
            (60, 50.0, 1.0, 1.5, 1.5)
        );
    }

    #[test]
    fn too_few_requests_wait_and_never_pass() {
        let v = judge(
            &traffic(49.0, 0.0, 0.1, 0.01),
            Some(&traffic(500.0, 0.0, 0.1, 0.01)),
            &thresholds(),
            true,
        );
        assert!(matches!(v, Verdict::Wait(_)), "{v:?}");
    }

    #[test]
    fn an_equal_canary_passes_with_its_figures() {
        let v = judge(
            &traffic(60.0, 0.0, 0.1, 0.01),
            Some(&traffic(600.0, 0.0, 0.1, 0.01)),
            &thresholds(),
            true,
        );
        let Verdict::Pass(f) = v else { panic!("{v:?}") };
        assert_eq!((f.canary_requests, f.stable_requests), (60.0, 600.0));
        assert_eq!((f.ttft_ratio, f.itl_ratio), (Some(1.0), Some(1.0)));
    }

    #[test]
    fn errors_above_stable_plus_the_allowance_fail_once_certain() {
        // Stable at 1 %, allowance 1 point: 2 % allowed. 2 errors in 60 is 3.3 %: fails.
        let stable = traffic(1000.0, 10.0, 0.1, 0.01);
        let v = judge(&traffic(60.0, 2.0, 0.1, 0.01), Some(&stable), &thresholds(), true);
        assert!(
            matches!(&v, Verdict::Fail { threshold, .. } if threshold.contains("error rate")),
            "{v:?}"
        );
        // 1 error in 60 (1.7 %) passes.
        assert!(matches!(
            judge(&traffic(60.0, 1.0, 0.1, 0.01), Some(&stable), &thresholds(), true),
            Verdict::Pass(_)
        ));
        // 2 errors in the first 5 requests: even 45 successes to come leave 4 % > 2 %: fail now.
        let v = judge(&traffic(5.0, 2.0, 0.1, 0.01), Some(&stable), &thresholds(), true);
        assert!(matches!(v, Verdict::Fail { .. }), "{v:?}");
        // 1 error in the first 5: 1/50 = 2 % is not above 2 %: wait for more.
        let v = judge(&traffic(5.0, 1.0, 0.1, 0.01), Some(&stable), &thresholds(), true);
        assert!(matches!(v, Verdict::Wait(_)), "{v:?}");
    }

    #[test]
    fn a_slow_first_token_fails_on_the_ratio_without_any_error() {
        let v = judge(
            &traffic(60.0, 0.0, 0.5, 0.01),
            Some(&traffic(600.0, 0.0, 0.1, 0.01)),
            &thresholds(),
            true,
        );
        let Verdict::Fail { threshold, figures } = v else {
            panic!("{v:?}")
        };
        assert!(threshold.contains("time to first token"), "{threshold}");
        assert!(figures.ttft_ratio.unwrap() > 1.5);
        assert_eq!(figures.canary_error_percent, 0.0);
    }

    #[test]
    fn a_slow_inter_token_latency_fails_on_its_ratio() {
        let v = judge(
            &traffic(60.0, 0.0, 0.1, 0.05),
            Some(&traffic(600.0, 0.0, 0.1, 0.01)),
            &thresholds(),
            true,
        );
        assert!(
            matches!(&v, Verdict::Fail { threshold, .. } if threshold.contains("inter-token")),
            "{v:?}"
        );
    }

    #[test]
    fn without_stable_latency_the_canary_waits() {
        let v = judge(
            &traffic(60.0, 0.0, 0.1, 0.01),
            Some(&Traffic::default()),
            &thresholds(),
            true,
        );
        assert!(matches!(v, Verdict::Wait(_)), "{v:?}");
    }

    #[test]
    fn without_anything_of_stable_errors_count_against_zero_and_latency_is_not_judged() {
        let slow = traffic(60.0, 0.0, 5.0, 1.0);
        assert!(matches!(
            judge(&slow, None, &thresholds(), true),
            Verdict::Pass(_)
        ));
        let failing = traffic(60.0, 1.0, 0.1, 0.01);
        assert!(matches!(
            judge(&failing, None, &thresholds(), true),
            Verdict::Fail { .. }
        ));
    }

    #[test]
    fn a_large_ratio_of_tiny_latencies_does_not_fail() {
        // ITL p95 ≈ 4 ms against ≈ 1 ms: 4× but +3 ms, inside what the histogram resolves.
        let fine = |n: f64, at: f64| {
            let mut b = Buckets::default();
            for le in [0.001, 0.002, 0.004, 0.008, f64::INFINITY] {
                b.add(le, if le >= at { n } else { 0.0 });
            }
            b
        };
        let with_itl = |n: f64, at: f64| Traffic {
            itl: fine(n, at),
            ..traffic(n, 0.0, 0.1, 0.01)
        };
        let (canary, stable) = (with_itl(60.0, 0.004), with_itl(600.0, 0.001));
        let v = judge(&canary, Some(&stable), &thresholds(), true);
        let Verdict::Pass(f) = v else { panic!("{v:?}") };
        assert!(f.itl_ratio.unwrap() > 3.0, "{f:?}");
    }

    #[test]
    fn a_bad_decimal_names_its_field() {
        let a = RolloutAnalysis {
            max_ttft_p95_ratio: "x".into(),
            ..Default::default()
        };
        let e = Thresholds::from_spec(Some(&a)).unwrap_err();
        assert!(e.contains("maxTtftP95Ratio"), "{e}");
    }

    #[test]
    fn latency_waits_for_half_a_window_but_errors_fail_at_once() {
        let stable = traffic(500.0, 0.0, 0.01, 0.005);
        let slow = traffic(60.0, 0.0, 0.5, 0.005);
        assert!(matches!(
            judge(&slow, Some(&stable), &thresholds(), true),
            Verdict::Fail { .. }
        ));
        assert!(matches!(
            judge(&slow, Some(&stable), &thresholds(), false),
            Verdict::Wait(_)
        ));
        let broken = traffic(60.0, 30.0, 0.01, 0.005);
        assert!(matches!(
            judge(&broken, Some(&stable), &thresholds(), false),
            Verdict::Fail { .. }
        ));
    }
}
