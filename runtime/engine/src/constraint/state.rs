//! One sequence's position in its grammar: llguidance's `Matcher`, advanced by every committed token,
//! giving the mask of tokens allowed next.
//!
//! Invariants: the state has seen exactly the sequence's committed output tokens (EOS and stop ids end
//! the sequence and are not fed); [`GrammarState::mask`] leaves every disallowed logit at `-inf` and
//! the allowed ones untouched; [`GrammarState::rollback`] undoes the last tokens exactly; a speculative
//! draft is never fed to the state (the verifier commits only accepted tokens, and a draft model's
//! proposal is masked by [`GrammarState::mask_ahead`] on a copy of the matcher); dropping the state releases it (the owner's
//! live count goes down), so a cancelled or finished request frees its grammar state with its
//! `Sequence`. The state lives in the `Sequence`, not beside the KV blocks, so preemption (which frees
//! blocks and recomputes them) keeps it as it was.

use crate::error::{EngineError, Result};
use llguidance::Matcher;
use llguidance::toktrie::SimpleVob;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts live states for the [`super::Grammars`] that made them.
pub(crate) struct LiveGuard(Arc<AtomicUsize>);

impl LiveGuard {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count.clone())
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A sequence's grammar state.
pub struct GrammarState {
    matcher: Matcher,
    /// The mask last computed (until the next commit), so it can be applied again.
    last_mask: Option<SimpleVob>,
    /// Tokens fed so far (for rollback bounds).
    consumed: usize,
    _live: LiveGuard,
}

fn err(context: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Constraint(format!("structured output {context}: {e}"))
}

impl GrammarState {
    pub(crate) fn new(matcher: Matcher, live: LiveGuard) -> Self {
        Self {
            matcher,
            last_mask: None,
            consumed: 0,
            _live: live,
        }
    }

    /// Sets every logit the grammar does not allow next to `-inf`.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        if self.last_mask.is_none() {
            let m = self.matcher.compute_mask().map_err(|e| err("mask", e))?;
            self.last_mask = Some(m);
        }
        self.apply_last(logits);
        Ok(())
    }

    /// Applies the last computed mask again (to a fresh copy of a row), if there is one.
    pub fn apply_last(&self, logits: &mut [f32]) {
        if let Some(m) = &self.last_mask {
            apply(m, logits);
        }
    }

    /// The mask after `drafted` tokens beyond the committed ones, computed on a copy of the matcher,
    /// so this state never sees a draft (a refused token or a failed mask would leave llguidance's
    /// matcher in its error state for good). `None` when the grammar refuses a draft, stops within
    /// them, or the mask fails: the caller then proposes unmasked.
    pub fn mask_ahead(&self, drafted: &[u32]) -> Option<TokenMask> {
        let mut m = self.matcher.clone();
        if m.is_error() || m.try_consume_tokens(drafted).ok()? < drafted.len() || m.is_stopped() {
            return None;
        }
        m.compute_mask().ok().map(TokenMask)
    }

    /// Whether `token` is allowed next (computes the mask if needed).
    pub fn allows(&mut self, token: u32) -> Result<bool> {
        if self.last_mask.is_none() {
            let m = self.matcher.compute_mask().map_err(|e| err("mask", e))?;
            self.last_mask = Some(m);
        }
        Ok(self.last_mask.as_ref().is_some_and(|m| m.is_allowed(token)))
    }

    /// Advances the grammar by a generated token.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.last_mask = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| err(&format!("refused token {token}"), e))?;
        self.consumed += 1;
        Ok(())
    }

    /// Takes back the last `n` committed tokens.
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        if n > self.consumed {
            return Err(err(
                "rollback",
                format!("{n} tokens asked, {} consumed", self.consumed),
            ));
        }
        self.last_mask = None;
        self.matcher.rollback(n).map_err(|e| err("rollback", e))?;
        self.consumed -= n;
        Ok(())
    }

    /// Whether the grammar is complete and nothing may follow (the sequence ends here).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the output so far is a complete sentence of the grammar (EOS would be allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

/// A mask computed ahead of the committed tokens ([`GrammarState::mask_ahead`]).
pub struct TokenMask(SimpleVob);

impl TokenMask {
    /// Sets every logit this mask does not allow to `-inf`.
    pub fn apply(&self, logits: &mut [f32]) {
        apply(&self.0, logits);
    }
}

/// Sets every logit `m` does not allow to `-inf`, the allowed ones untouched.
fn apply(m: &SimpleVob, logits: &mut [f32]) {
    for (chunk, &word) in logits.chunks_mut(32).zip(m.as_slice()) {
        if word == u32::MAX {
            continue;
        }
        for (i, l) in chunk.iter_mut().enumerate() {
            if word & (1 << i) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    // Rows longer than the mask (never for a grammar built for this vocabulary) are disallowed.
    for l in logits.iter_mut().skip(m.as_slice().len() * 32) {
        *l = f32::NEG_INFINITY;
    }
}
