//! Speculative decoding: propose several tokens cheaply, let the target model score them all in one
//! forward pass (a short prefill chunk: the last committed token and the drafts), and keep the ones
//! exact speculative sampling accepts — so one weight read yields several tokens when the drafts are
//! good, and the output distribution is exactly the target's whatever they are.
//!
//! - [`ngram`]: prompt lookup (`method: "ngram"`), point-mass proposals from the request's own tokens.
//! - [`draft`]: a smaller model with the same tokenizer (`model: PATH`), with its own paged KV cache,
//!   drafting for every speculating sequence in one batched pass per draft position.
//! - [`verify`]: the exact verifier (accept with `min(1, p/q)`, else draw from `norm(max(0, p − q))`,
//!   bonus token from `p` after a fully accepted run); `p` comes from the request's own
//!   [`crate::sequence::Sequence`] through the same processors and transforms as ordinary sampling.
//! - [`gate`]: when speculation is skipped — in steps with many running requests (vLLM's
//!   `disable_by_batch_size`) and, per sequence, while its recent acceptance is low.
//! - [`cost`]: whether a step's drafts pay for themselves, from measured step times (positions →
//!   seconds) and draft costs: speculation gets out of the way when the step is compute-bound or the
//!   draft model costs too much, without a hand-set batch size.
//! - [`stats`]: chi-square statistics for the exactness tests.
//!
//! The scheduler (`sched::scheduler::spec`) grants a speculating sequence `1 + k` positions of its
//! token budget, allocates KV for them, and after verification truncates its block table back to the
//! accepted tokens (`KvCacheManager::truncate`); only blocks filled entirely by accepted tokens are
//! registered in the prefix cache, so a rejected draft is never findable by hash.
//!
//! Invariants: speculation never changes what a request can output, only how fast — greedy requests
//! give the same tokens with it on or off, n-gram speculation gives seeded requests the same tokens
//! too (point-mass verification commits the token ordinary sampling draws), and a draft model's
//! distribution-verified proposals keep the target's distribution exactly.

pub mod cost;
pub mod draft;
pub mod gate;
pub mod ngram;
pub mod stats;
pub mod verify;

pub use verify::Rule;

/// How drafts are proposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecMethod {
    /// Prompt lookup over the request's own tokens.
    Ngram {
        /// Shortest suffix n-gram looked up.
        prompt_lookup_min: usize,
        /// Longest suffix n-gram looked up (tried first).
        prompt_lookup_max: usize,
    },
    /// A draft model loaded beside the target (`Engine::attach_draft`).
    DraftModel,
}

/// Speculative decoding settings (vLLM's `--speculative-config` keys where vLLM has one).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecConfig {
    /// Drafted tokens per speculating sequence and step (`num_speculative_tokens`).
    pub num_speculative_tokens: usize,
    /// The proposer.
    pub method: SpecMethod,
    /// Steps with at least this many running requests do not speculate (`disable_by_batch_size`):
    /// there the step is compute-bound and verification positions cost as much as real tokens.
    pub disable_by_batch_size: Option<usize>,
    /// A sequence whose recent acceptance rate falls below this stops speculating for a while
    /// (`min_acceptance_rate`, ours; 0 disables the gate).
    pub min_acceptance_rate: f32,
    /// The verification rule (always [`Rule::Exact`] outside the negative-control tests).
    pub rule: Rule,
    /// Whether the measured step costs decide which drafts a step keeps (`cost::StepCost`; always on
    /// outside the tests that must see every proposal verified).
    pub cost_gate: bool,
}

impl SpecConfig {
    /// The n-gram proposer with `k` drafts and lookups of `min..=max` tokens.
    pub fn ngram(k: usize, min: usize, max: usize) -> Self {
        Self {
            num_speculative_tokens: k,
            method: SpecMethod::Ngram {
                prompt_lookup_min: min,
                prompt_lookup_max: max,
            },
            disable_by_batch_size: None,
            min_acceptance_rate: gate::DEFAULT_MIN_ACCEPTANCE,
            rule: Rule::Exact,
            cost_gate: true,
        }
    }

    /// A draft model proposing `k` tokens.
    pub fn draft_model(k: usize) -> Self {
        Self {
            num_speculative_tokens: k,
            method: SpecMethod::DraftModel,
            ..Self::ngram(k, 1, 1)
        }
    }

    /// Checks the settings, naming the field and its limit.
    pub fn validate(&self) -> Result<(), String> {
        let k = self.num_speculative_tokens;
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&k) {
            return Err(format!(
                "num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got {k}"
            ));
        }
        if let SpecMethod::Ngram {
            prompt_lookup_min: lo,
            prompt_lookup_max: hi,
        } = self.method
            && !(1 <= lo && lo <= hi && hi <= MAX_LOOKUP)
        {
            return Err(format!(
                "prompt_lookup_min and prompt_lookup_max must satisfy 1 <= min <= max <= {MAX_LOOKUP}, \
                 got {lo} and {hi}"
            ));
        }
        if self.disable_by_batch_size == Some(0) {
            return Err("disable_by_batch_size must be >= 1".into());
        }
        if !(0.0..=1.0).contains(&self.min_acceptance_rate) {
            return Err(format!(
                "min_acceptance_rate must be in [0, 1], got {}",
                self.min_acceptance_rate
            ));
        }
        Ok(())
    }
}

/// Most drafted tokens per step (a verification chunk is at most this + 1 positions).
pub const MAX_SPECULATIVE_TOKENS: usize = 16;
/// Longest n-gram looked up.
pub const MAX_LOOKUP: usize = 64;

/// Speculation counters since start (vLLM's `spec_decode_*` metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecCounters {
    /// Verification runs with at least one draft (`vllm:spec_decode_num_drafts`).
    pub drafts: u64,
    /// Drafted tokens verified (`vllm:spec_decode_num_draft_tokens`).
    pub draft_tokens: u64,
    /// Drafted tokens accepted (`vllm:spec_decode_num_accepted_tokens`).
    pub accepted_tokens: u64,
    /// Accepted drafts by position in the run (`vllm:spec_decode_num_accepted_tokens_per_pos`).
    pub accepted_per_position: Vec<u64>,
    /// Draft tokens on offer before the step-cost gate (n-gram proposals; a draft model's wants).
    pub proposed_tokens: u64,
    /// Of those, the tokens the gate kept (verification may still get fewer: the token budget, a
    /// draft model's round).
    pub kept_tokens: u64,
}

impl SpecCounters {
    /// Records one verified run of `drafted` tokens of which the first `accepted` were accepted.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.drafts += 1;
        self.draft_tokens += drafted as u64;
        self.accepted_tokens += accepted as u64;
        if self.accepted_per_position.len() < drafted {
            self.accepted_per_position.resize(drafted, 0);
        }
        self.accepted_per_position[..accepted]
            .iter_mut()
            .for_each(|c| *c += 1);
    }
}
