//! One request's generation state, which the scheduler keeps beside its KV blocks: the validated
//! parameters, the request's own seeded RNG, the token history for penalties, the incremental
//! detokenizer and the stop-string buffer. [`Sequence::step`] turns the request's row of logits into
//! the next token, the text it makes safe to emit, and whether the request is finished.
//!
//! A structured-output constraint lives here too: its grammar state masks the row after the other
//! processors, advances with each committed token, and ends the request with `stop` once the grammar
//! is complete (nothing may follow). It is part of the sequence, so preemption keeps it and dropping
//! the sequence (finish, cancel) frees it.
//!
//! Speculative decoding goes through the same per-token path: [`Sequence::verify`] shapes each
//! verification row exactly as [`Sequence::step`] shapes its one row (same processors, same grammar
//! mask, same history, the grammar advanced token by token as drafts are accepted), checks the draft
//! with [`crate::speculative::verify`], and commits through the same stop checks — so stops, `max_tokens`, stop
//! strings, EOS and a completed grammar inside an accepted run end it exactly where ordinary decoding
//! would, and nothing uncommitted ever touches the state. A draft model's proposal for a constrained
//! request is masked by the grammar advanced along the drafts so far and then rolled back
//! ([`Sequence::propose`]), so the committed grammar state never sees a draft.
//!
//! Invariants: the randomness of output position `n` is fixed by the seed and `n` alone — the sampling
//! uniform is word `2n` of the seed's ChaCha8 stream 0 (so a seed reproduces a request whatever shares
//! its batch, and exactly as the earlier one-draw-per-token stream did), the speculative acceptance coin
//! word `2n` of stream 1, a draft model's draw word `2n` of stream 2; EOS (unless `ignore_eos`) and
//! `stop_token_ids` stop with reason `stop` and their text is not emitted; stop strings are checked only
//! once `min_tokens` tokens exist (vLLM's rule); on any finish the
//! held-back text that is not part of a stop string is flushed, so no text is lost.

use crate::constraint::GrammarState;
use crate::error::Result;
use crate::sampling::{
    SampleOutput, Shaped, TokenHistory, ValidSamplingParams, draw, processors, report, sample_with, shape,
};
use crate::speculative::verify::{Rule, verify};
use crate::stop::{FinishReason, StopStrings};
use crate::tokenizer::{IncrementalDetokenizer, Tokenizer};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What one step produced for a request.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    /// The generated token.
    pub token: u32,
    /// Its logprob and the top alternatives, when requested.
    pub logprobs: Option<SampleOutput>,
    /// Text now safe to emit (may be empty).
    pub text: String,
    /// Set when this token finished the request.
    pub finish: Option<FinishReason>,
}

/// The result of verifying a run of drafted tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct Verified {
    /// One event per committed token: the accepted drafts, then the correction or bonus token — fewer
    /// when a token finished the request.
    pub events: Vec<TokenEvent>,
    /// Drafts accepted (their positions' KV, computed in the verification chunk, stays valid).
    pub accepted: usize,
    /// Set when a later row failed (a grammar mask out of fuel) after `events` were committed: they go
    /// out, then the request ends with `error` — where ordinary decoding would have failed too.
    pub error: Option<String>,
}

/// A draft model's proposal for one position, as the verifier needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftToken {
    /// The proposed token.
    pub token: u32,
    /// The distribution it was drawn from (`None`: verify it as a point mass).
    pub q: Option<Vec<f32>>,
}

/// Which uniform of an output position (see the module header).
#[derive(Clone, Copy)]
enum Stream {
    Sample = 0,
    Accept = 1,
    Draft = 2,
}

/// A request's sampling and stopping state.
pub struct Sequence {
    params: ValidSamplingParams,
    /// The seed of the request's randomness (drawn when the request gave none).
    seed: u64,
    history: TokenHistory,
    detok: IncrementalDetokenizer,
    stops: StopStrings,
    /// Ids that mean end-of-sequence for this model.
    eos: Vec<u32>,
    prompt_len: usize,
    /// The model's context limit (prompt + output).
    max_model_len: usize,
    output: Vec<u32>,
    finished: Option<FinishReason>,
    /// The structured-output grammar's state, for a constrained request.
    grammar: Option<GrammarState>,
}

impl Sequence {
    /// State for a request with `prompt`, stopping at `eos` ids and `max_model_len` total tokens.
    pub fn new(prompt: &[u32], params: ValidSamplingParams, eos: &[u32], max_model_len: usize) -> Self {
        let seed = params.seed.unwrap_or_else(rand::random);
        Self {
            seed,
            history: TokenHistory::new(prompt),
            detok: IncrementalDetokenizer::new(prompt, params.skip_special_tokens),
            stops: StopStrings::new(params.stop.clone()),
            eos: eos.to_vec(),
            prompt_len: prompt.len(),
            max_model_len,
            output: Vec::new(),
            finished: None,
            grammar: params.constraint.as_ref().map(|g| g.start()),
            params,
        }
    }

    /// Tokens generated so far.
    pub fn output(&self) -> &[u32] {
        &self.output
    }

    /// Why it finished, once it has.
    pub fn finished(&self) -> Option<FinishReason> {
        self.finished
    }

    /// The validated parameters.
    pub fn params(&self) -> &ValidSamplingParams {
        &self.params
    }

    /// Most tokens this request may still generate (`max_tokens` and the context limit).
    pub fn remaining(&self) -> usize {
        let by_context = self
            .max_model_len
            .saturating_sub(self.prompt_len + self.output.len());
        let by_max = self
            .params
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(self.output.len()));
        by_context.min(by_max)
    }

    /// The uniform of `stream` for output position `n`: word `2n` of the seed's ChaCha8 stream.
    fn uniform(&self, stream: Stream, n: usize) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(stream as u64);
        rng.set_word_pos(2 * n as u128);
        rng.random()
    }

    /// The EOS ids in force (none with `ignore_eos`).
    fn eos(&self) -> &[u32] {
        if self.params.ignore_eos { &[] } else { &self.eos }
    }

    /// A copy of `logits` after every logits processor and the grammar's mask, against the committed
    /// history and grammar state.
    fn process(&mut self, logits: &[f32]) -> Result<Vec<f32>> {
        let mut row = logits.to_vec();
        processors::apply(&mut row, &self.params, &self.history, self.eos());
        if let Some(g) = &mut self.grammar {
            mask_row(g, &mut row, logits)?;
        }
        Ok(row)
    }

    /// Samples the next token from this request's row of `logits` and checks the stop conditions.
    pub fn step(&mut self, tokenizer: &Tokenizer, logits: &[f32]) -> Result<TokenEvent> {
        let mut row = self.process(logits)?;
        let u = self.uniform(Stream::Sample, self.output.len());
        let sampled = sample_with(&mut row, &self.params, u);
        self.commit(tokenizer, sampled)
    }

    /// Verifies `drafts` against `rows` — `drafts.len() + 1` rows of `vocab` logits, the target's
    /// scores after the last committed token and after each draft — and commits the accepted drafts
    /// plus one more token (the correction after a rejection, or the bonus after the last row), each
    /// through the same processing and stop checks as [`Self::step`]. Stops at the first rejection or
    /// finish.
    pub fn verify(
        &mut self,
        tokenizer: &Tokenizer,
        rows: &[f32],
        vocab: usize,
        drafts: &[DraftToken],
        rule: Rule,
    ) -> Result<Verified> {
        let mut out = Verified {
            events: Vec::with_capacity(drafts.len() + 1),
            accepted: 0,
            error: None,
        };
        for (i, logits) in rows.chunks_exact(vocab).take(drafts.len() + 1).enumerate() {
            let n = self.output.len();
            let mut row = match self.process(logits) {
                Ok(row) => row,
                Err(e) if out.events.is_empty() => return Err(e),
                Err(e) => {
                    out.error = Some(e.to_string());
                    break;
                }
            };
            let shaped = shape(&mut row, &self.params);
            let u = self.uniform(Stream::Sample, n);
            let (token, accepted) = match drafts.get(i) {
                Some(d) => {
                    let r = self.uniform(Stream::Accept, n);
                    let v = verify(&row, shaped, d.token, d.q.as_deref(), r, u, rule);
                    (v.token, v.accepted)
                }
                None => match shaped {
                    Shaped::Greedy(t) => (t, false),
                    Shaped::Probs => (draw(&row, u), false),
                },
            };
            let ev = match self.commit(tokenizer, report(&mut row, shaped, token, self.params.logprobs)) {
                Ok(ev) => ev,
                Err(e) if out.events.is_empty() => return Err(e),
                Err(e) => {
                    out.error = Some(e.to_string());
                    break;
                }
            };
            let done = ev.finish.is_some();
            out.events.push(ev);
            out.accepted += accepted as usize;
            if done || !accepted {
                break;
            }
        }
        Ok(out)
    }

    /// A draft model's proposal at the position after `drafted` (drafts already proposed this round):
    /// its `logits` shaped by this request's processors and transforms against the committed history
    /// extended by `drafted`. Greedy requests get the argmax (a point mass); sampled ones a token drawn
    /// with the position's draft uniform, with the distribution it came from.
    pub fn propose(&self, logits: &[f32], drafted: &[u32]) -> DraftToken {
        let mut history = self.history.clone();
        drafted.iter().for_each(|&t| history.push(t));
        let mut row = logits.to_vec();
        processors::apply(&mut row, &self.params, &history, self.eos());
        if let Some(m) = self.grammar.as_ref().and_then(|g| g.mask_ahead(drafted)) {
            // The grammar advanced along the drafts, on a copy. Proposing unmasked would still be exact
            // (the verifier masks the target's rows); masked, the drafts are more often accepted.
            let mut masked = row.clone();
            m.apply(&mut masked);
            if !masked.iter().any(|&l| l > f32::NEG_INFINITY) {
                // As in `mask_row`: the grammar wins over the processors.
                masked.copy_from_slice(logits);
                m.apply(&mut masked);
            }
            if masked.iter().any(|&l| l > f32::NEG_INFINITY) {
                row = masked;
            }
        }
        match shape(&mut row, &self.params) {
            Shaped::Greedy(token) => DraftToken { token, q: None },
            Shaped::Probs => {
                let u = self.uniform(Stream::Draft, self.output.len() + drafted.len());
                DraftToken {
                    token: draw(&row, u),
                    q: Some(row),
                }
            }
        }
    }

    /// Records `sampled` as the next token and checks the stop conditions.
    fn commit(&mut self, tokenizer: &Tokenizer, sampled: SampleOutput) -> Result<TokenEvent> {
        let token = sampled.chosen.token;
        self.history.push(token);
        self.output.push(token);
        let logprobs = self.params.logprobs.map(|_| sampled);
        let mut text = String::new();
        let mut finish = None;
        let mut by_string = false;
        if self.eos().contains(&token) || self.params.stop_token_ids.contains(&token) {
            finish = Some(FinishReason::Stop);
        } else {
            if let Some(g) = &mut self.grammar {
                g.commit(token)?;
                if g.is_finished() {
                    finish = Some(FinishReason::Stop);
                }
            }
            let delta = self.detok.push(tokenizer, token)?;
            if self.output.len() < self.params.min_tokens {
                text = delta;
            } else {
                let o = self.stops.push(&delta);
                text = o.emit;
                if o.stopped {
                    finish = Some(FinishReason::Stop);
                    by_string = true;
                }
            }
        }
        if finish.is_none()
            && (self.params.max_tokens.is_some_and(|m| self.output.len() >= m)
                || self.prompt_len + self.output.len() >= self.max_model_len)
        {
            finish = Some(FinishReason::Length);
        }
        if let Some(reason) = finish {
            // After a stop-string match nothing after it is emitted; otherwise flush what was held.
            if !by_string {
                text.push_str(&self.drain(tokenizer)?);
            }
            self.finished = Some(reason);
        }
        Ok(TokenEvent {
            token,
            logprobs,
            text,
            finish,
        })
    }

    /// Ends the request from outside (cancelled, timeout, error) and returns the text still held back.
    pub fn abort(&mut self, tokenizer: &Tokenizer, reason: FinishReason) -> Result<String> {
        if self.finished.is_some() {
            return Ok(String::new());
        }
        self.finished = Some(reason);
        self.drain(tokenizer)
    }

    /// Text held back by the detokenizer and the stop buffer when generation ends (a stop string can
    /// still complete inside the detokenizer's tail; then only the text before it comes out).
    fn drain(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let tail = self.detok.flush(tokenizer)?;
        let o = self.stops.push(&tail);
        let mut out = o.emit;
        if !o.stopped {
            out.push_str(&self.stops.flush());
        }
        Ok(out)
    }
}

/// Masks `row` (already processed from `raw`) with the grammar's next-token mask. When the processors
/// took every token the grammar allows (`min_tokens` hiding the EOS that alone completes it, or stop
/// ids), the grammar wins: the raw row, masked.
fn mask_row(g: &mut GrammarState, row: &mut [f32], raw: &[f32]) -> Result<()> {
    g.mask(row)?;
    if !row.iter().any(|&l| l > f32::NEG_INFINITY) {
        row.copy_from_slice(raw);
        g.apply_last(row);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
