//! Sampling: validated parameters ([`params`]), logits processors in vLLM's order ([`processors`]), and
//! the sampler with logprobs ([`sampler`]).
//!
//! Invariants: only [`SamplingParams::validate`] builds a [`ValidSamplingParams`], so the processors and
//! sampler never see NaN, infinities or out-of-range values; each request owns one seeded RNG that is
//! consumed exactly once per generated token, so a seed reproduces the same tokens whatever else
//! shares the batch.

pub mod params;
pub mod processors;
pub mod sampler;

pub use params::{SamplingParams, ValidSamplingParams};
pub use processors::TokenHistory;
pub use sampler::{SampleOutput, Shaped, TokenLogprob, draw, report, sample, sample_with, shape};
