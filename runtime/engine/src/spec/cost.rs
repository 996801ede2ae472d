//! Whether speculating pays in this step, from measured step times rather than a fixed batch size.
//!
//! A verification position costs what it costs on this machine at this batch size: nearly nothing while
//! a step is bound by reading the weights (few sequences), as much as a real token once it is bound by
//! arithmetic (many sequences). The step loop reports every decode-shaped model step's positions and
//! seconds (steps with a prefill chunk are left out: their hundreds of positions would dominate the fit)
//! ([`StepCost::observe`]), and a draft model's rounds their seconds per drafted token
//! ([`StepCost::observe_draft`]); a linear fit t(n) = a + b·n over the recent steps (exponentially
//! forgotten, so it follows the batch sizes actually running) prices a step. Speculation is kept for a
//! step when the tokens it is expected to yield per second beat plain decoding's:
//!
//! (decoding + expected accepted) ÷ (t(positions + drafts) + draft seconds) > decoding ÷ t(positions)
//!
//! where expected accepted = Σ each sequence's recent acceptance rate × its drafts. Every
//! [`EXPLORE_EVERY`]th decision speculates anyway, so the fit keeps seeing both step sizes and a
//! changed workload is noticed.
//!
//! Invariants: the decision changes speed only — greedy and n-gram-verified requests commit the same
//! tokens whatever it decides, and the scheduler never applies it to a pinned request (a seeded,
//! sampled request under a draft model, whose text depends on when it speculates); without enough
//! measurements (fewer than [`MIN_SAMPLES`] steps, or all of one size) it speculates.

/// Weight kept by the older measurements at each new one (about the last 50 steps count).
const DECAY: f64 = 0.98;
/// Steps measured before the fit is used.
pub const MIN_SAMPLES: u64 = 8;
/// Every this many decisions speculate regardless (the fit needs steps with drafts to price them).
pub const EXPLORE_EVERY: u64 = 16;
/// Speculation must win by this share to be kept (noise in the fit should not flip it back and forth).
const MARGIN: f64 = 0.02;

/// Measured step costs and the decisions made from them.
#[derive(Clone, Debug, Default)]
pub struct StepCost {
    /// Decayed sums over (positions n, seconds t): weight, n, n², t, n·t.
    w: f64,
    n: f64,
    nn: f64,
    t: f64,
    nt: f64,
    samples: u64,
    /// Seconds per drafted token of a draft model (exponentially weighted), if measured.
    draft_per_token: Option<f64>,
    decisions: u64,
}

impl StepCost {
    /// Records one model step of `positions` scored positions that took `seconds`.
    pub fn observe(&mut self, positions: usize, seconds: f64) {
        if positions == 0 || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let n = positions as f64;
        self.w = self.w * DECAY + 1.0;
        self.n = self.n * DECAY + n;
        self.nn = self.nn * DECAY + n * n;
        self.t = self.t * DECAY + seconds;
        self.nt = self.nt * DECAY + n * seconds;
        self.samples += 1;
    }

    /// Records a draft model's round: `drafted` tokens in `seconds` (all its passes).
    pub fn observe_draft(&mut self, drafted: usize, seconds: f64) {
        if drafted == 0 || !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let per = seconds / drafted as f64;
        self.draft_per_token = Some(match self.draft_per_token {
            Some(old) => old * (1.0 - WEIGHT_DRAFT) + per * WEIGHT_DRAFT,
            None => per,
        });
    }

    /// The fit (a, b) of t(n) = a + b·n, if the measurements determine it; b is at least 0.
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.samples < MIN_SAMPLES {
            return None;
        }
        let mean_n = self.n / self.w;
        let var_n = self.nn / self.w - mean_n * mean_n;
        if var_n < 0.25 {
            return None; // every step the same size: the slope is unknown
        }
        let mean_t = self.t / self.w;
        let b = ((self.nt / self.w - mean_n * mean_t) / var_n).max(0.0);
        let a = (mean_t - b * mean_n).max(0.0);
        Some((a, b))
    }

    /// Whether a step of `positions` positions, `decoding` of whose sequences produce a token, should
    /// add `drafts` draft positions expected to yield `expected_accepted` more tokens (see the module
    /// header).
    pub fn pays(&mut self, positions: usize, decoding: usize, drafts: usize, expected_accepted: f64) -> bool {
        self.decisions += 1;
        if self.decisions.is_multiple_of(EXPLORE_EVERY) {
            return true;
        }
        let Some((a, b)) = self.fit() else {
            return true;
        };
        let t = |n: usize| a + b * n as f64;
        let plain = decoding as f64 / t(positions).max(1e-9);
        let draft_secs = self.draft_per_token.unwrap_or(0.0) * drafts as f64;
        let spec = (decoding as f64 + expected_accepted) / (t(positions + drafts) + draft_secs).max(1e-9);
        spec > plain * (1.0 + MARGIN)
    }
}

/// Weight of the newest draft round in the draft cost.
const WEIGHT_DRAFT: f64 = 0.2;

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds steps of 1..=max positions timed by `t`.
    fn measured(t: impl Fn(usize) -> f64, max: usize) -> StepCost {
        let mut c = StepCost::default();
        for i in 0..100 {
            let n = 1 + i % max;
            c.observe(n, t(n));
        }
        c
    }

    /// Decisions over many steps, exploration included: the share that speculated.
    fn share(c: &mut StepCost, positions: usize, decoding: usize, drafts: usize, expected: f64) -> f64 {
        let yes = (0..160)
            .filter(|_| c.pays(positions, decoding, drafts, expected))
            .count();
        yes as f64 / 160.0
    }

    #[test]
    fn the_fit_recovers_a_line() {
        let c = measured(|n| 0.010 + 0.0005 * n as f64, 40);
        let (a, b) = c.fit().unwrap();
        assert!((a - 0.010).abs() < 1e-9 && (b - 0.0005).abs() < 1e-9, "{a} {b}");
    }

    #[test]
    fn memory_bound_steps_speculate_and_compute_bound_ones_do_not() {
        // Weight reads dominate (10 ms a step, 0.1 ms a position): 1 sequence, 4 drafts, half accepted.
        let mut c = measured(|n| 0.010 + 0.0001 * n as f64, 80);
        assert_eq!(share(&mut c, 1, 1, 4, 2.0), 1.0);
        // Arithmetic dominates (1 ms a position): 16 sequences with 4 drafts each, half accepted —
        // 80 positions for 48 tokens against 16 for 16. Only the exploration steps speculate.
        let mut c = measured(|n| 0.0005 + 0.001 * n as f64, 80);
        assert_eq!(share(&mut c, 16, 16, 64, 32.0), 1.0 / EXPLORE_EVERY as f64);
        // Less arithmetic-bound (4 ms fixed): nearly every draft accepted pays, half does not.
        let mut c = measured(|n| 0.004 + 0.001 * n as f64, 80);
        assert_eq!(share(&mut c, 16, 16, 64, 63.0), 1.0);
        assert_eq!(share(&mut c, 16, 16, 64, 32.0), 1.0 / EXPLORE_EVERY as f64);
    }

    #[test]
    fn a_draft_model_as_costly_as_the_target_does_not_pay() {
        // Memory-bound target: 20 ms a step. A draft costing 20 ms a token with 3 drafts all accepted:
        // 4 tokens in 80 ms against 1 in 20 ms — no gain, and the margin says no.
        let mut c = measured(|n| 0.020 + 0.00001 * n as f64, 8);
        c.observe_draft(3, 0.060);
        assert_eq!(share(&mut c, 1, 1, 3, 3.0), 1.0 / EXPLORE_EVERY as f64);
        // A draft at a tenth of the target's cost pays.
        let mut c = measured(|n| 0.020 + 0.00001 * n as f64, 8);
        c.observe_draft(3, 0.006);
        assert_eq!(share(&mut c, 1, 1, 3, 2.5), 1.0);
    }

    #[test]
    fn without_measurements_it_speculates() {
        let mut c = StepCost::default();
        assert!(c.pays(16, 16, 64, 0.0));
        // All steps the same size: no slope, no verdict.
        for _ in 0..50 {
            c.observe(16, 0.02);
        }
        assert!(c.fit().is_none());
        assert!(c.pays(16, 16, 64, 0.0));
        // Nonsense measurements are ignored.
        c.observe(0, 1.0);
        c.observe(4, f64::NAN);
        c.observe(4, -1.0);
        assert_eq!(c.samples, 50);
    }
}
