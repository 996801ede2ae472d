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
//! Invariants: one RNG draw per generated token (so a seed reproduces a request whatever shares its
//! batch); EOS (unless `ignore_eos`) and `stop_token_ids` stop with reason `stop` and their text is not
//! emitted; stop strings are checked only once `min_tokens` tokens exist (vLLM's rule); on any finish the
//! held-back text that is not part of a stop string is flushed, so no text is lost.

use crate::constraint::GrammarState;
use crate::error::Result;
use crate::sampling::{SampleOutput, TokenHistory, ValidSamplingParams, processors, sample};
use crate::stop::{FinishReason, StopStrings};
use crate::tokenizer::{IncrementalDetokenizer, Tokenizer};
use rand::SeedableRng;
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

/// A request's sampling and stopping state.
pub struct Sequence {
    params: ValidSamplingParams,
    /// The request's own RNG, consumed once per token.
    rng: ChaCha8Rng,
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
            rng: ChaCha8Rng::seed_from_u64(seed),
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

    /// Samples the next token from this request's row of `logits` and checks the stop conditions.
    pub fn step(&mut self, tokenizer: &Tokenizer, logits: &[f32]) -> Result<TokenEvent> {
        let mut row = logits.to_vec();
        let eos: &[u32] = if self.params.ignore_eos { &[] } else { &self.eos };
        processors::apply(&mut row, &self.params, &self.history, eos);
        if let Some(g) = &mut self.grammar {
            g.mask(&mut row)?;
            if !row.iter().any(|&l| l > f32::NEG_INFINITY) {
                // The processors took every token the grammar allows (`min_tokens` hiding the EOS
                // that alone completes it, or stop ids): the grammar wins.
                row.copy_from_slice(logits);
                g.apply_last(&mut row);
            }
        }
        let sampled = sample(&mut row, &self.params, &mut self.rng);
        let token = sampled.chosen.token;
        self.history.push(token);
        self.output.push(token);
        let logprobs = self.params.logprobs.map(|_| sampled);
        let mut text = String::new();
        let mut finish = None;
        let mut by_string = false;
        if eos.contains(&token) || self.params.stop_token_ids.contains(&token) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;
    use crate::tokenizer::test_tokenizer::tokenizer;

    const END: u32 = 0;

    /// Drives a sequence with logits that make `script` the greedy choices; returns (text, reason).
    fn run(
        f: impl FnOnce(&mut SamplingParams),
        script: &[u32],
    ) -> (Vec<String>, Option<FinishReason>, Vec<u32>) {
        let t = tokenizer();
        let vocab = t.vocab_size();
        let mut p = SamplingParams::greedy(script.len());
        f(&mut p);
        let mut s = Sequence::new(&[1], p.validate(vocab).unwrap(), &[END], 1000);
        let mut texts = Vec::new();
        for &want in script {
            let mut logits = vec![0.0; vocab];
            logits[want as usize] = 10.0;
            logits[(want as usize + 1) % vocab] = 5.0; // the runner-up when `want` is masked
            let e = s.step(&t, &logits).unwrap();
            texts.push(e.text);
            if e.finish.is_some() {
                return (texts, e.finish, s.output().to_vec());
            }
        }
        (texts, None, s.output().to_vec())
    }

    fn ids(text: &str) -> Vec<u32> {
        tokenizer().encode(text, false).unwrap()
    }

    #[test]
    fn eos_stops_without_text_and_flushes_held_text() {
        let mut script = ids("xylo");
        script.push(END);
        let (texts, reason, _) = run(|p| p.stop = vec!["lo!".into()], &script);
        assert_eq!(reason, Some(FinishReason::Stop));
        assert_eq!(texts.concat(), "xylo", "held-back `lo` is flushed at EOS");
        assert_eq!(
            texts[texts.len() - 2],
            "",
            "`lo` was held while it could start `lo!`"
        );
    }

    #[test]
    fn stop_string_across_tokens_is_cut() {
        let script = ids("say STOP now");
        let (texts, reason, out) = run(|p| p.stop = vec!["STOP".into()], &script);
        assert_eq!(
            (texts.concat().as_str(), reason),
            ("say ", Some(FinishReason::Stop))
        );
        assert!(out.len() < script.len());
    }

    #[test]
    fn max_tokens_is_length_and_stop_ids_are_stop() {
        let script = ids("abc");
        let (texts, reason, _) = run(|_| {}, &script);
        assert_eq!(
            (texts.concat().as_str(), reason),
            ("abc", Some(FinishReason::Length))
        );
        let b = ids("b")[0];
        let (texts, reason, _) = run(|p| p.stop_token_ids = vec![b], &script);
        assert_eq!((texts.concat().as_str(), reason), ("a", Some(FinishReason::Stop)));
    }

    #[test]
    fn min_tokens_masks_eos_and_ignore_eos_keeps_going() {
        let script = [END, END, END];
        let (_, reason, out) = run(|p| p.min_tokens = 2, &script);
        assert_eq!(reason, Some(FinishReason::Stop));
        assert_eq!(out.len(), 3, "EOS masked for the first two tokens");
        assert_ne!(out[0], END);
        let (_, reason, out) = run(|p| p.ignore_eos = true, &script);
        assert_eq!((reason, out), (Some(FinishReason::Length), vec![END, END, END]));
    }

    #[test]
    fn context_limit_is_length() {
        let t = tokenizer();
        let mut s = Sequence::new(
            &[1, 2, 3],
            SamplingParams::greedy(100).validate(t.vocab_size()).unwrap(),
            &[END],
            5,
        );
        let mut logits = vec![0.0; t.vocab_size()];
        logits[5] = 1.0;
        assert_eq!(s.step(&t, &logits).unwrap().finish, None);
        assert_eq!(s.step(&t, &logits).unwrap().finish, Some(FinishReason::Length));
    }

    #[test]
    fn seeded_sampling_reproduces_and_abort_flushes() {
        let t = tokenizer();
        let vocab = t.vocab_size();
        let logits: Vec<f32> = (0..vocab).map(|i| ((i * 7919) % 13) as f32 * 0.3).collect();
        let draw = |seed| {
            let p = SamplingParams {
                seed: Some(seed),
                max_tokens: Some(20),
                ..SamplingParams::default()
            };
            let mut s = Sequence::new(&[1], p.validate(vocab).unwrap(), &[END], 1000);
            (0..20)
                .map(|_| s.step(&t, &logits).unwrap().token)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
        let e = ids("é");
        let mut s = Sequence::new(
            &[1],
            SamplingParams::greedy(10).validate(vocab).unwrap(),
            &[END],
            1000,
        );
        let mut l = vec![0.0; vocab];
        l[e[0] as usize] = 1.0;
        assert_eq!(s.step(&t, &l).unwrap().text, "");
        assert_eq!(s.abort(&t, FinishReason::Cancelled).unwrap(), "\u{FFFD}");
        assert_eq!(s.finished(), Some(FinishReason::Cancelled));
    }
}
