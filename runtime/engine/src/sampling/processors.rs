//! Logits processors, applied to one request's row of logits in vLLM's order: logit bias and
//! allowed/banned tokens → `min_tokens` (mask EOS and stop ids) → repetition penalty (divide positive
//! logits, multiply negative ones; prompt and output tokens) → presence and frequency penalties
//! (output tokens only).
//!
//! Invariants: processors only read the request's own history, so they are batch-invariant; a masked
//! token's logit is `-inf` and stays so through every later step.

use super::params::ValidSamplingParams;
use std::collections::{HashMap, HashSet};

/// The tokens a request has seen, for penalties.
#[derive(Clone, Debug, Default)]
pub struct TokenHistory {
    /// Distinct prompt tokens (repetition penalty covers the prompt too).
    prompt: HashSet<u32>,
    /// Generated tokens and their counts.
    output: HashMap<u32, u32>,
    /// Number of generated tokens.
    generated: usize,
}

impl TokenHistory {
    /// History of a request with `prompt`.
    pub fn new(prompt: &[u32]) -> Self {
        Self {
            prompt: prompt.iter().copied().collect(),
            ..Self::default()
        }
    }

    /// Records a generated token.
    pub fn push(&mut self, token: u32) {
        *self.output.entry(token).or_default() += 1;
        self.generated += 1;
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated
    }
}

/// Applies every processor to `logits` in place. `eos` are the ids that end generation at EOS.
pub fn apply(logits: &mut [f32], p: &ValidSamplingParams, history: &TokenHistory, eos: &[u32]) {
    for &(id, bias) in &p.logit_bias {
        logits[id as usize] += bias;
    }
    if let Some(allowed) = &p.allowed_token_ids {
        let mut keep = vec![false; logits.len()];
        allowed.iter().for_each(|&id| keep[id as usize] = true);
        logits
            .iter_mut()
            .zip(keep)
            .filter(|(_, k)| !k)
            .for_each(|(l, _)| *l = f32::NEG_INFINITY);
    }
    for &id in &p.banned_token_ids {
        logits[id as usize] = f32::NEG_INFINITY;
    }
    if history.generated < p.min_tokens {
        for &id in eos.iter().chain(&p.stop_token_ids) {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    if p.repetition_penalty != 1.0 {
        let r = p.repetition_penalty;
        for &id in history.prompt.iter().chain(history.output.keys()) {
            let l = &mut logits[id as usize];
            *l = if *l > 0.0 { *l / r } else { *l * r };
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        for (&id, &count) in &history.output {
            logits[id as usize] -= p.frequency_penalty * count as f32 + p.presence_penalty;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    fn run(f: impl FnOnce(&mut SamplingParams), prompt: &[u32], out: &[u32], logits: [f32; 5]) -> [f32; 5] {
        let mut p = SamplingParams::default();
        f(&mut p);
        let p = p.validate(5).unwrap();
        let mut h = TokenHistory::new(prompt);
        out.iter().for_each(|&t| h.push(t));
        let mut l = logits;
        apply(&mut l, &p, &h, &[4]);
        l
    }

    const NEG: f32 = f32::NEG_INFINITY;

    #[test]
    fn each_processor_and_their_order() {
        let base = [1.0, -1.0, 2.0, 0.5, 3.0];
        assert_eq!(run(|_| {}, &[], &[], base), base);
        assert_eq!(
            run(|p| p.logit_bias = vec![(1, 5.0)], &[], &[], base),
            [1.0, 4.0, 2.0, 0.5, 3.0]
        );
        assert_eq!(
            run(|p| p.allowed_token_ids = Some(vec![0, 2]), &[], &[], base),
            [1.0, NEG, 2.0, NEG, NEG]
        );
        assert_eq!(
            run(|p| p.banned_token_ids = vec![2], &[], &[], base),
            [1.0, -1.0, NEG, 0.5, 3.0]
        );
        let min = |p: &mut SamplingParams| {
            p.min_tokens = 2;
            p.stop_token_ids = vec![3];
        };
        assert_eq!(run(min, &[], &[0], base), [1.0, -1.0, 2.0, NEG, NEG]);
        assert_eq!(run(min, &[], &[0, 0], base), base, "min_tokens reached");
        // Repetition: prompt token 0 (positive: divided), output token 1 (negative: multiplied).
        assert_eq!(
            run(|p| p.repetition_penalty = 2.0, &[0], &[1], base),
            [0.5, -2.0, 2.0, 0.5, 3.0]
        );
        let pen = |p: &mut SamplingParams| {
            p.presence_penalty = 0.5;
            p.frequency_penalty = 0.25;
        };
        assert_eq!(
            run(pen, &[2], &[3, 3], base),
            [1.0, -1.0, 2.0, 0.5 - 0.5 - 0.5, 3.0],
            "output only"
        );
        // Bias applies before the repetition penalty: (1 + 3) / 2.
        let both = |p: &mut SamplingParams| {
            p.logit_bias = vec![(0, 3.0)];
            p.repetition_penalty = 2.0;
        };
        assert_eq!(run(both, &[0], &[], base)[0], 2.0);
    }
}
