//! Request sampling and stopping parameters and their validation.
//!
//! Names follow vLLM's `SamplingParams` (which extends OpenAI's): `top_k` 0 or -1 disables top-k,
//! `min_p`, `repetition_penalty`, `min_tokens`, `ignore_eos`, `stop_token_ids`, `seed`. Errors name the
//! parameter and its limit, in the style of the TGI router's validation.

use crate::constraint::CompiledGrammar;
use crate::error::{EngineError, Result};
use std::sync::Arc;

/// Most `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;
/// Bound on |logit_bias| (OpenAI's limit).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// Sampling and stopping parameters as a request gives them.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy; otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 or -1 = disabled.
    pub top_k: i32,
    /// Nucleus sampling mass, in (0, 1].
    pub top_p: f32,
    /// Drop tokens less likely than `min_p ×` the most likely one, in [0, 1].
    pub min_p: f32,
    /// RNG seed; `None` draws one.
    pub seed: Option<u64>,
    /// Values above 1 discourage tokens already in the prompt or output (divides positive logits,
    /// multiplies negative ones).
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already generated, in [-2, 2].
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of generated tokens, in [-2, 2].
    pub frequency_penalty: f32,
    /// Added to the logits of the given tokens, each in [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    /// If set, only these tokens may be generated.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// These tokens are never generated.
    pub banned_token_ids: Vec<u32>,
    /// EOS and `stop_token_ids` are masked until this many tokens were generated.
    pub min_tokens: usize,
    /// Generation stops after this many tokens (`None`: at the context limit).
    pub max_tokens: Option<usize>,
    /// Stop strings (excluded from the output).
    pub stop: Vec<String>,
    /// Extra token ids that stop generation.
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at EOS.
    pub ignore_eos: bool,
    /// Return the sampled token's logprob and this many top alternatives (0..=20).
    pub logprobs: Option<usize>,
    /// Drop special tokens from the output text.
    pub skip_special_tokens: bool,
    /// A structured-output grammar the output must follow (its mask is applied before sampling).
    pub constraint: Option<Arc<CompiledGrammar>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: -1,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            allowed_token_ids: None,
            banned_token_ids: Vec::new(),
            min_tokens: 0,
            max_tokens: Some(16),
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            skip_special_tokens: true,
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of up to `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            temperature: 0.0,
            max_tokens: Some(max_tokens),
            ..Self::default()
        }
    }

    /// Checks every field against its limit for a model with `vocab_size` logits.
    pub fn validate(self, vocab_size: usize) -> Result<ValidSamplingParams> {
        fn bad(field: &'static str, message: String) -> EngineError {
            EngineError::InvalidParam { field, message }
        }
        let finite = |field: &'static str, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(bad(field, format!("must be a finite number, got {v}")))
            }
        };
        finite("temperature", self.temperature)?;
        if self.temperature < 0.0 {
            return Err(bad(
                "temperature",
                format!("must be >= 0, got {}", self.temperature),
            ));
        }
        finite("top_p", self.top_p)?;
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad("top_p", format!("must be in (0, 1], got {}", self.top_p)));
        }
        if self.top_k < -1 {
            return Err(bad(
                "top_k",
                format!("must be -1 (disabled), 0 (disabled) or >= 1, got {}", self.top_k),
            ));
        }
        finite("min_p", self.min_p)?;
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(bad("min_p", format!("must be in [0, 1], got {}", self.min_p)));
        }
        finite("repetition_penalty", self.repetition_penalty)?;
        if self.repetition_penalty <= 0.0 {
            return Err(bad(
                "repetition_penalty",
                format!("must be > 0, got {}", self.repetition_penalty),
            ));
        }
        for (field, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            finite(field, v)?;
            if !(-2.0..=2.0).contains(&v) {
                return Err(bad(field, format!("must be in [-2, 2], got {v}")));
            }
        }
        let in_vocab = |field: &'static str, id: u32| {
            if (id as usize) < vocab_size {
                Ok(())
            } else {
                Err(bad(
                    field,
                    format!("token id {id} is outside the vocabulary (must be < {vocab_size})"),
                ))
            }
        };
        for &(id, b) in &self.logit_bias {
            in_vocab("logit_bias", id)?;
            if !b.is_finite() || b.abs() > MAX_LOGIT_BIAS {
                return Err(bad(
                    "logit_bias",
                    format!("bias for token {id} must be in [-100, 100], got {b}"),
                ));
            }
        }
        if let Some(allowed) = &self.allowed_token_ids {
            if allowed.is_empty() {
                return Err(bad("allowed_token_ids", "must not be empty".into()));
            }
            allowed
                .iter()
                .try_for_each(|&id| in_vocab("allowed_token_ids", id))?;
        }
        self.banned_token_ids
            .iter()
            .try_for_each(|&id| in_vocab("banned_token_ids", id))?;
        if let Some(allowed) = &self.allowed_token_ids
            && allowed.iter().all(|id| self.banned_token_ids.contains(id))
        {
            return Err(bad(
                "allowed_token_ids",
                "every allowed token is also banned".into(),
            ));
        }
        self.stop_token_ids
            .iter()
            .try_for_each(|&id| in_vocab("stop_token_ids", id))?;
        if let Some(max) = self.max_tokens {
            if max == 0 {
                return Err(bad("max_tokens", "must be >= 1, got 0".into()));
            }
            if self.min_tokens > max {
                return Err(bad(
                    "min_tokens",
                    format!("must be <= max_tokens ({max}), got {}", self.min_tokens),
                ));
            }
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(bad("stop", "stop strings must not be empty".into()));
        }
        if let Some(n) = self.logprobs
            && n > MAX_LOGPROBS
        {
            return Err(bad(
                "top_logprobs",
                format!("must be in [0, {MAX_LOGPROBS}], got {n}"),
            ));
        }
        if let Some(g) = &self.constraint {
            if g.vocab_size() != vocab_size {
                return Err(bad(
                    "constraint",
                    format!(
                        "was compiled for {} tokens, the model has {vocab_size}",
                        g.vocab_size()
                    ),
                ));
            }
            if self.ignore_eos {
                return Err(bad(
                    "ignore_eos",
                    "cannot be combined with structured output (the grammar decides where the output ends)"
                        .into(),
                ));
            }
        }
        let mut p = self;
        if p.temperature < GREEDY_BELOW_TEMPERATURE {
            // 1/T would overflow (1e-39 made every logit ±inf and every token id 0): this is greedy.
            p.temperature = 0.0;
        }
        Ok(ValidSamplingParams(p))
    }
}

/// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`): dividing logits by them overflows
/// `f32`, and what they ask for is the argmax anyway.
pub const GREEDY_BELOW_TEMPERATURE: f32 = 1e-5;

/// Parameters that passed [`SamplingParams::validate`]; only validation can build one.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidSamplingParams(SamplingParams);

impl std::ops::Deref for ValidSamplingParams {
    type Target = SamplingParams;
    fn deref(&self) -> &SamplingParams {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(f: impl FnOnce(&mut SamplingParams), want: Result<(), (&str, &str)>) {
        let mut p = SamplingParams::default();
        f(&mut p);
        match (p.validate(100), want) {
            (Ok(_), Ok(())) => {}
            (Err(EngineError::InvalidParam { field, message }), Err((f, m))) => {
                assert_eq!(field, f);
                assert!(message.contains(m), "{message:?} lacks {m:?}");
            }
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn validation_names_the_field_and_the_limit() {
        check(|_| {}, Ok(()));
        check(|p| p.temperature = 0.0, Ok(()));
        check(|p| p.temperature = f32::NAN, Err(("temperature", "finite")));
        check(|p| p.temperature = -0.5, Err(("temperature", ">= 0")));
        check(|p| p.temperature = 1e-39, Ok(()));
        check(|p| p.top_p = 0.0, Err(("top_p", "(0, 1]")));
        check(|p| p.top_p = 1.5, Err(("top_p", "(0, 1]")));
        check(|p| p.top_p = f32::INFINITY, Err(("top_p", "finite")));
        check(|p| p.top_k = -2, Err(("top_k", ">= 1")));
        check(|p| p.top_k = 0, Ok(()));
        check(|p| p.min_p = 1.1, Err(("min_p", "[0, 1]")));
        check(|p| p.repetition_penalty = 0.0, Err(("repetition_penalty", "> 0")));
        check(|p| p.presence_penalty = 2.5, Err(("presence_penalty", "[-2, 2]")));
        check(
            |p| p.frequency_penalty = -3.0,
            Err(("frequency_penalty", "[-2, 2]")),
        );
        check(|p| p.logit_bias = vec![(100, 1.0)], Err(("logit_bias", "< 100")));
        check(
            |p| p.logit_bias = vec![(5, 101.0)],
            Err(("logit_bias", "[-100, 100]")),
        );
        check(
            |p| p.allowed_token_ids = Some(vec![]),
            Err(("allowed_token_ids", "empty")),
        );
        check(
            |p| {
                p.allowed_token_ids = Some(vec![3]);
                p.banned_token_ids = vec![3];
            },
            Err(("allowed_token_ids", "also banned")),
        );
        check(
            |p| p.stop_token_ids = vec![7, 700],
            Err(("stop_token_ids", "700")),
        );
        check(|p| p.max_tokens = Some(0), Err(("max_tokens", ">= 1")));
        check(|p| p.min_tokens = 17, Err(("min_tokens", "<= max_tokens (16)")));
        check(|p| p.stop = vec![String::new()], Err(("stop", "empty")));
        check(|p| p.logprobs = Some(21), Err(("top_logprobs", "[0, 20]")));
    }
}
