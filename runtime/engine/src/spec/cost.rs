//! Which drafts pay in this step, from measured step times rather than a fixed batch size.
//!
//! A verification position costs what it costs on this machine at this batch size: nearly nothing while
//! a step is bound by reading the weights (few sequences), as much as a real token once it is bound by
//! arithmetic (many sequences). The step loop reports every decode-shaped model step's positions and
//! seconds (steps with a prefill chunk are left out: their hundreds of positions would dominate the fit)
//! ([`StepCost::observe`]), and a draft model's rounds their seconds per drafted token
//! ([`StepCost::observe_draft`]); a linear fit t(n) = a + b·n over the recent steps (exponentially
//! forgotten, so it follows the batch sizes actually running) prices a step, and each draft adds
//! c = b + the draft model's seconds per token.
//!
//! Each draft position is worth its chance of being accepted: the j-th draft of a sequence whose
//! per-token acceptance is α (`spec::gate`, starting from the deployment's figure, [`StepCost::prior`])
//! yields a token with probability α^j. [`StepCost::choose`] takes the positions of all sequences in
//! order of that worth while each raises the step's expected tokens per second — a position worth v
//! pays when v > (tokens so far ÷ seconds so far) × c — and keeps them only if the total beats plain
//! decoding by [`MARGIN`]. So a sequence that keeps accepting drafts keeps speculating in a batch where
//! the others' drafts would cost more than they yield, and a compute-bound step drafts only where it
//! pays. When nothing pays for [`EXPLORE_EVERY`] decisions in a row, the most promising sequence drafts
//! anyway: that keeps the slope and the draft cost measured, and finds the sequences whose own
//! acceptance is better than the deployment's (in a compute-bound batch of stories, the few that
//! repeat themselves pay for their drafts; a trial that doubled the gap while nothing paid drafted far
//! less there and measured 0.95× against 1.02–1.04× without it — docs/benchmarks.md). While no step
//! has drafts the fit cannot see the slope; the last one it saw is used.
//!
//! Invariants: the decision changes speed only — greedy and n-gram-verified requests commit the same
//! tokens whatever it decides, and the scheduler never applies it to a pinned request (a seeded,
//! sampled request under a draft model, whose text depends on when it speculates); without enough
//! measurements (fewer than [`MIN_SAMPLES`] steps, and no slope seen yet) every draft is kept.

/// Weight kept by the older measurements at each new one (about the last 50 steps count).
const DECAY: f64 = 0.98;
/// Steps measured before the fit is used.
pub const MIN_SAMPLES: u64 = 8;
/// Decisions in a row without paying drafts before one explores (the fit needs steps with drafts to
/// price them).
pub const EXPLORE_EVERY: u64 = 16;
/// Speculation must win by this share to be kept (noise in the fit should not flip it back and forth).
const MARGIN: f64 = 0.02;
/// Weight the deployment's acceptance counts keep at each verified run.
const KEEP_RUNS: f64 = 0.99;
/// The per-token acceptance assumed before any run was verified.
const FIRST_PRIOR: f64 = 0.5;

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
    /// The last fit the measurements determined.
    known: Option<(f64, f64)>,
    /// Decisions without paying drafts since the last exploration or paying decision.
    idle: u64,
    /// The deployment's decayed counts of accepted draft tokens and of trials (accepted tokens plus
    /// runs ended by a rejection).
    accepted: f64,
    trials: f64,
}

/// One sequence's drafts on offer this step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The chance that each draft is accepted given the ones before it were.
    pub per_token: f64,
    /// Drafts it may make.
    pub k: usize,
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

    /// Records a verified run: `accepted` of `drafted` drafts.
    pub fn observe_run(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let rejected = f64::from(u8::from(accepted < drafted));
        self.accepted = self.accepted * KEEP_RUNS + accepted as f64;
        self.trials = self.trials * KEEP_RUNS + accepted as f64 + rejected;
    }

    /// The deployment's per-token acceptance: what a sequence without runs of its own is assumed to
    /// accept.
    pub fn prior(&self) -> f64 {
        if self.trials < 1.0 {
            FIRST_PRIOR
        } else {
            self.accepted / self.trials
        }
    }

    /// How many of its drafts each candidate keeps in a step that scores `positions` positions
    /// without them (pinned requests' drafts included) and yields `decoding` tokens (see the module
    /// header).
    pub fn choose(&mut self, positions: usize, decoding: usize, candidates: &[Candidate]) -> Vec<usize> {
        let fit = self.fit();
        self.known = fit.or(self.known);
        let Some((a, b)) = self.known else {
            return candidates.iter().map(|c| c.k).collect();
        };
        let per_draft = b + self.draft_per_token.unwrap_or(0.0);
        // Every draft position with its worth; a sequence's are in order and never worth more than
        // the one before, so the stable sort keeps each sequence's kept drafts a prefix.
        let mut worth: Vec<(f64, usize)> = candidates
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                let p = c.per_token.clamp(0.0, 1.0);
                (1..=c.k).scan(1.0, move |w, _| {
                    *w *= p;
                    Some((*w, i))
                })
            })
            .collect();
        worth.sort_by(|x, y| y.0.total_cmp(&x.0));
        let mut keep = vec![0; candidates.len()];
        let mut tokens = decoding as f64;
        let mut seconds = (a + b * positions as f64).max(1e-9);
        let plain = tokens / seconds;
        for (v, i) in worth {
            if v * seconds <= tokens * per_draft {
                break;
            }
            tokens += v;
            seconds += per_draft;
            keep[i] += 1;
        }
        if tokens / seconds > plain * (1.0 + MARGIN) {
            self.idle = 0;
        } else {
            keep.fill(0);
            self.idle += 1;
            if self.idle >= EXPLORE_EVERY {
                self.idle = 0;
                let best = (0..candidates.len()).max_by(|&x, &y| {
                    let (cx, cy) = (&candidates[x], &candidates[y]);
                    cx.per_token.total_cmp(&cy.per_token).then(cx.k.cmp(&cy.k))
                });
                if let Some(i) = best {
                    keep[i] = candidates[i].k;
                }
            }
        }
        keep
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

    fn seqs(n: usize, per_token: f64, k: usize) -> Vec<Candidate> {
        vec![Candidate { per_token, k }; n]
    }

    /// 160 decisions, exploration included: how often each pattern of kept drafts came out.
    fn decisions(
        c: &mut StepCost,
        positions: usize,
        decoding: usize,
        cands: &[Candidate],
    ) -> Vec<(Vec<usize>, usize)> {
        let mut seen: Vec<(Vec<usize>, usize)> = Vec::new();
        for _ in 0..160 {
            let keep = c.choose(positions, decoding, cands);
            match seen.iter_mut().find(|(k, _)| *k == keep) {
                Some((_, n)) => *n += 1,
                None => seen.push((keep, 1)),
            }
        }
        seen.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        seen
    }

    #[test]
    fn the_fit_recovers_a_line() {
        let c = measured(|n| 0.010 + 0.0005 * n as f64, 40);
        let (a, b) = c.fit().unwrap();
        assert!((a - 0.010).abs() < 1e-9 && (b - 0.0005).abs() < 1e-9, "{a} {b}");
    }

    #[test]
    fn memory_bound_steps_speculate_and_compute_bound_ones_do_not() {
        // Weight reads dominate (10 ms a step, 0.1 ms a position): 1 sequence, 4 drafts of which even
        // the 4th (worth 0.5⁴) pays.
        let mut c = measured(|n| 0.010 + 0.0001 * n as f64, 80);
        assert_eq!(decisions(&mut c, 1, 1, &seqs(1, 0.5, 4)), vec![(vec![4], 160)]);
        // Arithmetic dominates (1 ms a position): 16 sequences accepting half their drafts. A draft
        // costs what a real token does and yields at most half of one: only exploration drafts, one
        // sequence at a time, every 16th decision.
        let mut c = measured(|n| 0.0005 + 0.001 * n as f64, 80);
        let mut explore = vec![0; 16];
        explore[15] = 4;
        assert_eq!(
            decisions(&mut c, 16, 16, &seqs(16, 0.5, 4)),
            vec![(vec![0; 16], 150), (explore, 10)]
        );
    }

    #[test]
    fn in_a_compute_bound_batch_only_the_sequences_that_accept_draft() {
        // 4 ms fixed, 1 ms a position, 16 sequences: a draft pays when its worth is above ~0.8 tokens.
        let mut c = measured(|n| 0.004 + 0.001 * n as f64, 80);
        let mut cands = seqs(15, 0.3, 4);
        cands.insert(
            3,
            Candidate {
                per_token: 0.98,
                k: 4,
            },
        );
        let mut want = vec![0; 16];
        want[3] = 4;
        assert_eq!(decisions(&mut c, 16, 16, &cands), vec![(want.clone(), 160)]);
        // Everyone accepting nearly everything: everyone drafts.
        assert_eq!(
            decisions(&mut c, 16, 16, &seqs(16, 0.99, 4)),
            vec![(vec![4; 16], 160)]
        );
        // With 10 ms fixed a draft pays above ~0.62 tokens, a little more as the step's yield rises: a
        // sequence accepting 9 in 10 keeps 4 of its 6 drafts (0.9⁴ = 0.66 pays, 0.9⁵ = 0.59 not).
        let mut c = measured(|n| 0.010 + 0.001 * n as f64, 80);
        cands[3] = Candidate { per_token: 0.9, k: 6 };
        assert_eq!(decisions(&mut c, 16, 16, &cands), vec![(want, 160)]);
    }

    #[test]
    fn a_draft_model_as_costly_as_the_target_does_not_pay() {
        // Memory-bound target: 20 ms a step. A draft costing 20 ms a token with every draft accepted:
        // each yields a token for a token's time, no gain; only exploration drafts.
        let mut c = measured(|n| 0.020 + 0.00001 * n as f64, 8);
        c.observe_draft(3, 0.060);
        assert_eq!(
            decisions(&mut c, 1, 1, &seqs(1, 1.0, 3)),
            vec![(vec![0], 150), (vec![3], 10)]
        );
        // A draft at a tenth of the target's cost pays.
        let mut c = measured(|n| 0.020 + 0.00001 * n as f64, 8);
        c.observe_draft(3, 0.006);
        assert_eq!(decisions(&mut c, 1, 1, &seqs(1, 0.8, 3)), vec![(vec![3], 160)]);
    }

    #[test]
    fn exploration_follows_16_decisions_without_paying_drafts_and_the_last_slope_is_kept() {
        let mut c = measured(|n| 0.0005 + 0.001 * n as f64, 80);
        let bad = seqs(4, 0.2, 4);
        let explored_at = |c: &mut StepCost, n: usize| -> Vec<usize> {
            (1..=n)
                .filter(|_| c.choose(4, 4, &bad).iter().any(|&k| k > 0))
                .collect()
        };
        assert_eq!(explored_at(&mut c, 100), vec![16, 32, 48, 64, 80, 96]);
        // A decision whose drafts pay restarts the count.
        assert_eq!(explored_at(&mut c, 10), Vec::<usize>::new());
        assert_eq!(c.choose(4, 4, &seqs(4, 1.0, 4)), vec![4; 4]);
        assert_eq!(explored_at(&mut c, 40), vec![16, 32]);
        // A thousand steps of one size: the fit has no slope, and the last one prices the drafts.
        for _ in 0..1000 {
            c.observe(4, 0.0045);
        }
        assert!(c.fit().is_none());
        assert_eq!(c.choose(4, 4, &bad), vec![0; 4]);
        assert_eq!(c.choose(4, 4, &seqs(4, 1.0, 4)), vec![4; 4]);
    }

    #[test]
    fn the_deployment_prior_follows_verified_runs() {
        let mut c = StepCost::default();
        assert_eq!(c.prior(), FIRST_PRIOR);
        c.observe_run(4, 4);
        assert_eq!(c.prior(), 1.0);
        // 4 accepted of 4 trials, then 1 accepted and a rejection (decayed once).
        c.observe_run(4, 1);
        let (a, n) = (4.0 * KEEP_RUNS + 1.0, 4.0 * KEEP_RUNS + 2.0);
        assert!((c.prior() - a / n).abs() < 1e-12);
        c.observe_run(0, 0);
        assert!((c.prior() - a / n).abs() < 1e-12);
    }

    #[test]
    fn without_measurements_it_speculates() {
        let mut c = StepCost::default();
        let cands = seqs(16, 0.0, 4);
        assert_eq!(c.choose(16, 16, &cands), vec![4; 16]);
        // All steps the same size: no slope, no verdict.
        for _ in 0..50 {
            c.observe(16, 0.02);
        }
        assert!(c.fit().is_none());
        assert_eq!(c.choose(16, 16, &cands), vec![4; 16]);
        // Nonsense measurements are ignored.
        c.observe(0, 1.0);
        c.observe(4, f64::NAN);
        c.observe(4, -1.0);
        assert_eq!(c.samples, 50);
    }
}
