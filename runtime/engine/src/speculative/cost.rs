//! Which drafts pay in this step, from measured step times rather than a fixed batch size.
//!
//! A verification position costs what it costs on this machine at this batch size: nearly nothing while
//! a step is bound by reading the weights (few sequences), as much as a real token once it is bound by
//! arithmetic (many sequences). The step loop reports every decode-shaped model step's positions and
//! seconds (steps with a prefill chunk are left out: their hundreds of positions would dominate the fit)
//! ([`StepCost::observe`]; the others go to a fallback fit over every step,
//! [`StepCost::observe_prefill`]), and every pass of a draft model its fed tokens and seconds
//! ([`StepCost::observe_draft`]). Two linear fits t(n) = a + b·n over the recent measurements
//! (exponentially forgotten, so they follow the batch sizes actually running) price a step: the
//! target's prices the plain step and each verification position (its slope b); the draft model's
//! prices each draft pass (its a: a round of j drafts runs j passes, shared by every sequence drafting
//! that many) and each token a pass feeds (its b: the draft being fed, and with a sequence's first draft
//! its catch-up — the committed tokens its draft cache skipped while it did not draft, up to its whole
//! prompt the first time).
//!
//! Each draft position is worth its chance of being accepted: the j-th draft of a sequence whose
//! per-token acceptance is α (`speculative::gate`, starting from the deployment's figure, [`StepCost::prior`])
//! yields a token with probability α^j. [`StepCost::choose`] takes the positions of all sequences in
//! order of that worth, each when it raises the step's expected tokens per second — a position worth v
//! costing c pays when v > (tokens so far ÷ seconds so far) × c — and keeps them only if the total
//! beats plain decoding by [`MARGIN`]. So a sequence that keeps accepting drafts keeps speculating in a
//! batch where the others' drafts would cost more than they yield, a compute-bound step drafts only
//! where it pays, and a draft model that fell behind drafts again only when the steps it would draft in
//! pay for its catch-up (shared by the steps left if it drafted in each: `remaining` tokens over the
//! expected tokens a step).
//!
//! When nothing pays for [`EXPLORE_EVERY`] decisions in a row, the most promising sequence drafts
//! anyway, if drafts accepted every time would pay (otherwise its acceptance does not matter and there
//! is nothing to learn): that keeps the slope measured and finds the sequences whose own acceptance is
//! better than the deployment's (in a compute-bound batch of stories, the few that repeat themselves
//! pay for their drafts; a trial that doubled the gap while nothing paid drafted far less there and
//! measured 0.95× against 1.02–1.04× without it — docs/benchmarks.md). While no step has drafts the
//! fit cannot see the slope; the last one it saw is used. While every step drafts as much as the last
//! (one stream under a draft model: always 1 + k positions) the slope is unknown too, so every
//! [`EXPLORE_EVERY`]-th such step decodes plainly to show it; until a slope is seen, a step is priced
//! at the mean measured one and verification at the slope of every step (prefill chunks included: on a
//! CPU a prefill position costs about what a verification position does), or at nothing before that.
//!
//! Invariants: the decision changes speed only — greedy and n-gram-verified requests commit the same
//! tokens whatever it decides, and the scheduler never applies it to a pinned request (a seeded,
//! sampled request under a draft model, whose text depends on when it speculates); without enough
//! measurements (no step yet) every draft is kept.

/// Weight kept by the older measurements at each new one (about the last 50 steps count).
const DECAY: f64 = 0.98;
/// Steps measured before the fit is used.
pub const MIN_SAMPLES: u64 = 8;
/// Measurements before a fallback fit (every step's, the draft model's passes) is used.
const MIN_SAMPLES_FALLBACK: u64 = 3;
/// Decisions in a row without paying drafts before one explores (the fit needs steps with drafts to
/// price them).
pub const EXPLORE_EVERY: u64 = 16;
/// Speculation must win by this share to be kept (noise in the fit should not flip it back and forth).
const MARGIN: f64 = 0.02;
/// Weight the deployment's acceptance counts keep at each verified run.
const KEEP_RUNS: f64 = 0.99;
/// The per-token acceptance assumed before any run was verified.
const FIRST_PRIOR: f64 = 0.5;

/// A least-squares line t(n) = a + b·n over exponentially forgotten measurements.
#[derive(Clone, Debug)]
struct Line {
    /// Measurements before the fit is used.
    min_samples: u64,
    /// Decayed sums over (positions n, seconds t): weight, n, n², t, n·t.
    w: f64,
    n: f64,
    nn: f64,
    t: f64,
    nt: f64,
    samples: u64,
    /// The last fit the measurements determined.
    known: Option<(f64, f64)>,
}

impl Line {
    fn new(min_samples: u64) -> Self {
        Self {
            min_samples,
            w: 0.0,
            n: 0.0,
            nn: 0.0,
            t: 0.0,
            nt: 0.0,
            samples: 0,
            known: None,
        }
    }

    fn observe(&mut self, positions: usize, seconds: f64) {
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

    /// (a, b) with b at least 0, if the measurements determine them.
    fn fit(&self) -> Option<(f64, f64)> {
        if self.samples < self.min_samples {
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

    /// The current fit, else the last one seen.
    fn price(&mut self) -> Option<(f64, f64)> {
        self.known = self.fit().or(self.known);
        self.known
    }
}

/// Measured step costs and the decisions made from them.
#[derive(Clone, Debug)]
pub struct StepCost {
    /// The target model's decode-shaped steps.
    target: Line,
    /// All its steps, prefill chunks included: their slope prices verification until the
    /// decode-shaped steps show one.
    all: Line,
    /// The draft model's passes (catch-up passes included).
    draft: Line,
    /// Decisions without paying drafts since the last exploration or paying decision.
    idle: u64,
    /// Decisions since the last plain probe of a slope not yet seen.
    probe: u64,
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
    /// Committed tokens its draft cache lacks beyond the one every round feeds (a draft model's
    /// catch-up; 0 for n-gram lookup).
    pub behind: usize,
    /// Tokens the request may still generate: the catch-up is paid once and shared by the steps it
    /// will still draft in.
    pub remaining: usize,
}

impl Candidate {
    /// This step's share of its catch-up, at `fed` seconds a fed token: the whole of it spread over
    /// the steps left if it drafts all its k drafts in each.
    fn catch_up(&self, fed: f64) -> f64 {
        let per_step = 1.0 + expected(self.per_token, self.k);
        let steps = (self.remaining as f64 / per_step).max(1.0);
        fed * self.behind as f64 / steps
    }
}

/// What drafting costs on top of plain decoding, in seconds.
#[derive(Clone, Copy, Debug)]
struct Prices {
    /// Each verification position (the target's slope).
    position: f64,
    /// Each draft pass (the draft model's fixed cost), paid once per draft position of the round.
    pass: f64,
    /// Each token a draft pass feeds (drafts and catch-up tokens alike).
    fed: f64,
}

impl Default for StepCost {
    fn default() -> Self {
        Self {
            target: Line::new(MIN_SAMPLES),
            all: Line::new(MIN_SAMPLES_FALLBACK),
            draft: Line::new(MIN_SAMPLES_FALLBACK),
            idle: 0,
            probe: 0,
            accepted: 0.0,
            trials: 0.0,
        }
    }
}

impl StepCost {
    /// Records one decode-shaped model step (every sequence scoring its last token and its drafts) of
    /// `positions` scored positions that took `seconds`.
    pub fn observe(&mut self, positions: usize, seconds: f64) {
        self.target.observe(positions, seconds);
        self.all.observe(positions, seconds);
    }

    /// Records a model step with a prefill chunk.
    pub fn observe_prefill(&mut self, positions: usize, seconds: f64) {
        self.all.observe(positions, seconds);
    }

    /// Records one draft-model pass that fed `positions` tokens in `seconds`.
    pub fn observe_draft(&mut self, positions: usize, seconds: f64) {
        self.draft.observe(positions, seconds);
    }

    /// The target's fit (a, b) of t(n) = a + b·n, if the measurements determine it.
    pub fn fit(&self) -> Option<(f64, f64)> {
        self.target.fit()
    }

    /// The draft model's (pass, fed-token) prices: the fit of its passes, else the last one seen, else
    /// (while all its passes had one size) every second charged to the tokens; nothing without passes.
    fn draft_prices(&mut self) -> (f64, f64) {
        if let Some(fit) = self.draft.price() {
            return fit;
        }
        if self.draft.n > 0.0 {
            (0.0, self.draft.t / self.draft.n)
        } else {
            (0.0, 0.0)
        }
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
        let fitted = self.target.price();
        if fitted.is_none() {
            if self.target.samples == 0 {
                return candidates.iter().map(|c| c.k).collect();
            }
            // Steps all of one size (every one drafting as much as the last) leave the slope unknown,
            // so every so often such a step decodes plainly to show it.
            self.probe += 1;
            if self.target.samples >= MIN_SAMPLES && self.probe >= EXPLORE_EVERY {
                self.probe = 0;
                return vec![0; candidates.len()];
            }
        }
        // Until the decode-shaped steps show a slope, a step costs the mean one and a verification
        // position what a position of any step does (prefill chunks included), or nothing.
        let (a, b) = fitted.unwrap_or_else(|| {
            let b = self.all.price().map_or(0.0, |(_, b)| b);
            let t = &self.target;
            (((t.t - b * t.n) / t.w).max(0.0), b)
        });
        let (pass, fed) = self.draft_prices();
        let prices = Prices {
            position: b,
            pass,
            fed,
        };
        let plain_seconds = (a + b * positions as f64).max(1e-9);
        let plain = decoding as f64 / plain_seconds;
        let mut keep = pick(candidates, prices, decoding as f64, plain_seconds);
        if rate(candidates, &keep, prices, decoding as f64, plain_seconds) > plain * (1.0 + MARGIN) {
            self.idle = 0;
            return keep;
        }
        keep.fill(0);
        self.idle += 1;
        if self.idle >= EXPLORE_EVERY {
            self.idle = 0;
            let best = (0..candidates.len()).max_by(|&x, &y| {
                let (cx, cy) = (&candidates[x], &candidates[y]);
                cx.per_token.total_cmp(&cy.per_token).then(cx.k.cmp(&cy.k))
            });
            if let Some(i) = best {
                // Only when drafts accepted every time would pay: else there is nothing to learn.
                let mut sure = vec![0; candidates.len()];
                sure[i] = candidates[i].k;
                let perfect: Vec<Candidate> = candidates
                    .iter()
                    .map(|c| Candidate { per_token: 1.0, ..*c })
                    .collect();
                if rate(&perfect, &sure, prices, decoding as f64, plain_seconds) > plain {
                    keep = sure;
                }
            }
        }
        keep
    }
}

/// The drafts that raise the step's expected tokens per second, taken best first: the j-th draft of a
/// sequence accepting α per token is worth α^j and costs a verification position, a fed token, a
/// draft pass if no sequence taken so far drafts j tokens, and with a sequence's first draft its
/// catch-up tokens.
fn pick(candidates: &[Candidate], prices: Prices, decoding: f64, plain_seconds: f64) -> Vec<usize> {
    // Every draft position (worth, sequence, j); a sequence's are in order and never worth more than
    // the one before, so the stable sort keeps them in order.
    let mut worth: Vec<(f64, usize, usize)> = candidates
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            let p = c.per_token.clamp(0.0, 1.0);
            (1..=c.k).scan(1.0, move |w, j| {
                *w *= p;
                Some((*w, i, j))
            })
        })
        .collect();
    worth.sort_by(|x, y| y.0.total_cmp(&x.0));
    let mut keep = vec![0; candidates.len()];
    let (mut tokens, mut seconds, mut passes) = (decoding, plain_seconds, 0);
    for (v, i, j) in worth {
        if keep[i] + 1 != j {
            continue; // an earlier draft of this sequence was not taken
        }
        let mut cost = prices.position + prices.fed;
        if j > passes {
            cost += prices.pass;
        }
        if j == 1 {
            cost += candidates[i].catch_up(prices.fed);
        }
        if v * seconds <= tokens * cost {
            continue;
        }
        tokens += v;
        seconds += cost;
        passes = passes.max(j);
        keep[i] = j;
    }
    keep
}

/// The tokens `k` drafts accepting `per_token` each are expected to yield: α + α² + … + α^k.
fn expected(per_token: f64, k: usize) -> f64 {
    let p = per_token.clamp(0.0, 1.0);
    (1..=k).map(|j| p.powi(j as i32)).sum()
}

/// The expected tokens per second of a step in which each candidate keeps `keep` drafts.
fn rate(candidates: &[Candidate], keep: &[usize], prices: Prices, decoding: f64, plain_seconds: f64) -> f64 {
    let (mut tokens, mut seconds) = (decoding, plain_seconds);
    let passes = keep.iter().copied().max().unwrap_or(0);
    seconds += prices.pass * passes as f64;
    for (c, &k) in candidates.iter().zip(keep) {
        if k == 0 {
            continue;
        }
        tokens += expected(c.per_token, k);
        seconds += (prices.position + prices.fed) * k as f64 + c.catch_up(prices.fed);
    }
    tokens / seconds
}

#[cfg(test)]
mod tests;
