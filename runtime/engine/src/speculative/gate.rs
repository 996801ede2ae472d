//! When speculation is skipped because it would not pay.
//!
//! - Per step: with `disable_by_batch_size` set, a step with at least that many running requests does
//!   not speculate (the step is then compute-bound, and `k` verification positions per sequence cost
//!   about what `k` real tokens cost).
//! - Per sequence: an exponentially weighted acceptance rate of its recent verification runs; when it
//!   falls below `min_acceptance_rate`, the sequence decodes plainly for a back-off of 4 decode steps,
//!   doubling up to 64 while its probes keep failing, then probes again with one speculative step.
//!   A probe that meets the rate resets the back-off.
//!
//! Beside the rate, the gate keeps the sequence's per-token acceptance (the chance that a draft is
//! accepted given the drafts before it were, from decayed counts of accepted tokens and rejections),
//! which the step-cost model (`speculative::cost`) prices each draft position with.
//!
//! Invariants: the per-sequence gate depends only on the sequence's own history (so a seeded request
//! makes the same decisions alone or batched); steps without a proposal (nothing to look up) neither
//! count against nor for a sequence.

/// Default `min_acceptance_rate`.
pub const DEFAULT_MIN_ACCEPTANCE: f32 = 0.2;
/// Weight of the newest run in the rate.
const WEIGHT: f32 = 0.3;
const MIN_BACKOFF: u32 = 4;
/// How many trials the deployment's per-token acceptance counts for in a sequence's estimate.
pub const PRIOR_TRIALS: f64 = 8.0;
/// Weight the per-token counts keep at each run (about the last 7 runs count).
const KEEP: f32 = 0.95;
const MAX_BACKOFF: u32 = 64;

/// One sequence's acceptance history.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AcceptanceGate {
    /// Recent acceptance rate (accepted ÷ drafted, exponentially weighted).
    rate: f32,
    /// Decode steps still to skip.
    skip: u32,
    /// The next back-off.
    backoff: u32,
    /// Decayed count of accepted draft tokens.
    accepted: f32,
    /// Decayed count of trials: accepted draft tokens plus runs that ended in a rejection.
    trials: f32,
}

impl Default for AcceptanceGate {
    fn default() -> Self {
        Self {
            rate: 1.0,
            skip: 0,
            backoff: MIN_BACKOFF,
            accepted: 0.0,
            trials: 0.0,
        }
    }
}

impl AcceptanceGate {
    /// The recent acceptance rate (1 before the first run).
    pub fn rate(&self) -> f32 {
        self.rate
    }

    /// The chance that a draft is accepted when the drafts before it were: the sequence's own recent
    /// runs, with `prior` (the deployment's figure) counted as [`PRIOR_TRIALS`] trials.
    pub fn per_token(&self, prior: f64) -> f64 {
        let (a, n) = (f64::from(self.accepted), f64::from(self.trials));
        (a + PRIOR_TRIALS * prior) / (n + PRIOR_TRIALS)
    }

    /// Whether this decode step may speculate; a skipped step counts down the back-off.
    pub fn allows(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// Records a verified run: `accepted` of `drafted` tokens, against the threshold `min_rate`.
    pub fn record(&mut self, drafted: usize, accepted: usize, min_rate: f32) {
        if drafted == 0 {
            return;
        }
        let run = accepted as f32 / drafted as f32;
        let rejected = f32::from(u8::from(accepted < drafted));
        self.accepted = KEEP * self.accepted + accepted as f32;
        self.trials = KEEP * self.trials + accepted as f32 + rejected;
        self.rate = (1.0 - WEIGHT) * self.rate + WEIGHT * run;
        if self.rate < min_rate {
            self.skip = self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            // The probe after the back-off is judged on its own: one bad run backs off again.
            self.rate = min_rate;
        } else if run >= min_rate {
            self.backoff = MIN_BACKOFF;
        }
    }
}

/// Whether a step with `running` requests may speculate under `disable_by_batch_size`.
pub fn step_allows(running: usize, disable_by_batch_size: Option<usize>) -> bool {
    disable_by_batch_size.is_none_or(|limit| running < limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_acceptance_backs_off_doubling_and_a_good_probe_resets() {
        let mut g = AcceptanceGate::default();
        // Rate 1.0 → 0.7 → 0.49 → 0.343 → 0.24 → 0.168 < 0.2: skip after five bad runs.
        for _ in 0..4 {
            assert!(g.allows());
            g.record(4, 0, 0.2);
        }
        assert!(g.allows());
        g.record(4, 0, 0.2);
        let skipped = (0..10).take_while(|_| !g.allows()).count();
        assert_eq!(skipped, 4);
        // A bad probe backs off again, twice as long.
        g.record(4, 0, 0.2);
        assert_eq!((0..100).take_while(|_| !g.allows()).count(), 8);
        // A good probe resets the back-off.
        g.record(4, 4, 0.2);
        assert!(g.allows());
        // 0.44 → 0.308 → 0.216 → 0.151: three bad runs, and the back-off is back to 4.
        for _ in 0..3 {
            g.record(4, 0, 0.2);
        }
        assert_eq!((0..100).take_while(|_| !g.allows()).count(), 4);
        // No drafts: no change.
        let before = g;
        g.record(0, 0, 0.2);
        assert_eq!(g, before);
    }

    #[test]
    fn per_token_acceptance_starts_at_the_prior_and_follows_the_runs() {
        let mut g = AcceptanceGate::default();
        assert_eq!(g.per_token(0.6), 0.6);
        // Runs of 4 drafts: all accepted, then 1 accepted and a rejection, decayed by KEEP a run; the
        // prior counts as PRIOR_TRIALS trials.
        let (keep, prior) = (f64::from(KEEP), PRIOR_TRIALS);
        g.record(4, 4, 0.2);
        assert!((g.per_token(0.5) - (4.0 + 0.5 * prior) / (4.0 + prior)).abs() < 1e-6);
        g.record(4, 1, 0.2);
        let (a, n) = (keep * 4.0 + 1.0, keep * 4.0 + 2.0);
        assert!((g.per_token(0.5) - (a + 0.5 * prior) / (n + prior)).abs() < 1e-6);
        // A sequence whose drafts keep failing goes towards 0 whatever the prior: at most
        // prior × 0.9 ÷ (prior + 1 ÷ (1 − KEEP)).
        for _ in 0..200 {
            g.record(4, 0, 0.0);
        }
        let bound = prior * 0.9 / (prior + 1.0 / (1.0 - keep)) + 1e-3;
        assert!(g.per_token(0.9) < bound, "{} {bound}", g.per_token(0.9));
        assert!(bound < 0.26);
    }

    #[test]
    fn batch_size_gate() {
        assert!(step_allows(100, None));
        assert!(step_allows(3, Some(4)));
        assert!(!step_allows(4, Some(4)));
    }
}
