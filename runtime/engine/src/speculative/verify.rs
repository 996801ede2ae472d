//! Exact speculative sampling (Leviathan et al. 2023, "Fast Inference from Transformers via
//! Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
//! Sampling"): one drafted token `x`, proposed from a distribution `q`, is checked against the target
//! distribution `p` — the request's row after every logits processor and sampling transform, shaped by
//! [`crate::sampling::shape`] exactly as ordinary sampling shapes it.
//!
//! - accept `x` with probability `min(1, p(x) / q(x))` (the coin is `r`, a uniform of its own);
//! - on rejection, draw from the correction distribution `norm(max(0, p − q))` (with the uniform `u`);
//! - when every draft of a run is accepted, the caller draws one bonus token from the next row's `p`.
//!
//! Then the committed token is distributed exactly as `p`, whatever `q` is, provided the draft was
//! chosen independently of `r` and `u`.
//!
//! A proposer that names a token without a distribution (n-gram lookup, or a draft model proposing for a
//! seeded request; see `spec`) is a point mass, `q = δ_x`. Its acceptance probability is `p(x)` and its
//! correction distribution is `p` without `x`, renormalised. This module realises both with one uniform:
//! draw `y` from `p` by inverse CDF with `u` (exactly what [`crate::sampling::sample_with`] does with the
//! same `u`), accept iff `y == x`, and commit `y` either way. `P(accept) = p(x)`, and given a rejection
//! `u` is uniform outside `x`'s interval of the CDF, so `y` follows `p` restricted to tokens other than
//! `x`, renormalised — the correction distribution. The committed token is then the very token the
//! request would have sampled without speculation, which is what keeps seeded requests token-identical
//! with speculation on or off.
//!
//! Greedy targets (`temperature == 0`) are the point mass on the processed argmax: a draft is accepted
//! iff it is that token, and the committed token is that token.
//!
//! [`Rule::ResampleTarget`] is a deliberately wrong verifier (on rejection it draws from `p` instead of
//! the correction distribution); it exists only so the statistical tests can show they detect it.

use crate::sampling::{Shaped, draw};

/// Which verification rule to apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rule {
    /// Exact speculative sampling.
    #[default]
    Exact,
    /// WRONG on purpose: on rejection, draw from `p` instead of `norm(max(0, p − q))`. Only the negative
    /// controls of the test suite use it; nothing in the server can select it (`--speculative-config`
    /// has no key for it).
    ResampleTarget,
}

/// What verification committed at one position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The token committed at this position (the draft when accepted).
    pub token: u32,
    /// Whether the draft was accepted (then the next drafted position is verified too).
    pub accepted: bool,
}

/// Verifies `draft` at one position. `target` is the request's row after [`crate::sampling::shape`]
/// (probabilities for [`Shaped::Probs`]; left as processed logits for [`Shaped::Greedy`]); `q` is the
/// draft's full proposal distribution, or `None` for a point mass; `r` and `u` are independent uniforms
/// in [0, 1), independent of how the draft was chosen.
pub fn verify(
    target: &[f32],
    shaped: Shaped,
    draft: u32,
    q: Option<&[f32]>,
    r: f64,
    u: f64,
    rule: Rule,
) -> Verdict {
    let probs = match shaped {
        // p = δ_t: min(1, p(x)/q(x)) is 1 for x = t and 0 otherwise, and max(0, δ_t − q) lives on t.
        Shaped::Greedy(t) => {
            return Verdict {
                token: t,
                accepted: t == draft,
            };
        }
        Shaped::Probs => target,
    };
    let q = match q {
        Some(q) if q.get(draft as usize).is_some_and(|&qx| qx > 0.0) => q,
        // A point mass (or a draft its own distribution did not allow: then it is a point mass too).
        _ => return point_mass(probs, draft, r, u, rule),
    };
    let (px, qx) = (probs[draft as usize] as f64, q[draft as usize] as f64);
    if r * qx < px {
        return Verdict {
            token: draft,
            accepted: true,
        };
    }
    let token = match rule {
        Rule::Exact => correction(probs, q, u).unwrap_or_else(|| draw(probs, u)),
        Rule::ResampleTarget => draw(probs, u),
    };
    Verdict {
        token,
        accepted: false,
    }
}

/// Point-mass verification by one inverse-CDF draw (see the module header).
fn point_mass(probs: &[f32], draft: u32, r: f64, u: f64, rule: Rule) -> Verdict {
    match rule {
        Rule::Exact => {
            let y = draw(probs, u);
            Verdict {
                token: y,
                accepted: y == draft,
            }
        }
        // The wrong rule: accept with probability p(x), else resample from p — where x can come back.
        Rule::ResampleTarget if r < probs[draft as usize] as f64 => Verdict {
            token: draft,
            accepted: true,
        },
        Rule::ResampleTarget => Verdict {
            token: draw(probs, u),
            accepted: false,
        },
    }
}

/// Draws from `norm(max(0, p − q))` with `u`, walking tokens in index order; `None` when the residual
/// has no mass (then `p == q` up to rounding, and the caller draws from `p`).
fn correction(p: &[f32], q: &[f32], u: f64) -> Option<u32> {
    let residual = |i: usize| (p[i] as f64 - q.get(i).copied().unwrap_or(0.0) as f64).max(0.0);
    let total: f64 = (0..p.len()).map(residual).sum();
    if total <= 0.0 {
        return None;
    }
    let target = u * total;
    let mut cum = 0.0;
    let mut last = None;
    for i in 0..p.len() {
        let m = residual(i);
        if m > 0.0 {
            last = Some(i as u32);
            cum += m;
            if cum > target {
                return last;
            }
        }
    }
    last
}

#[cfg(test)]
mod tests;
