//! Turns one row of processed logits into a token: greedy when `temperature == 0` (decided before any
//! division; the lowest index wins ties), else temperature → top-k → softmax → top-p (keeping the token
//! that crosses the threshold) → min-p → one uniform draw. Reports the logprob of the chosen token and
//! the top alternatives under the final distribution (the one sampled from).
//!
//! The steps are public ([`shape`], [`draw`], [`report`]) so speculative verification computes the
//! target distribution through exactly the same code as ordinary sampling.
//!
//! Invariants: exactly one `f64` is drawn from the request's RNG per call, greedy or not, so a seed
//! gives the same sequence whatever the batch; the draw walks tokens in index order, so the result
//! does not depend on sort stability; ties in top-k at the k-th value are all kept (as vLLM does).

use super::params::ValidSamplingParams;
use modelfleet_kernels::cpu::{max_lanes, softmax_in_place};
use rand::RngExt;

/// A token with its log-probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token id.
    pub token: u32,
    /// Its log-probability under the final distribution.
    pub logprob: f32,
}

/// The sampler's result for one step.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleOutput {
    /// The chosen token and its logprob (NaN for greedy sampling without `logprobs`, where it is
    /// not computed).
    pub chosen: TokenLogprob,
    /// The most likely tokens (most likely first, ties by lower id), if logprobs were requested.
    pub top: Vec<TokenLogprob>,
}

/// What [`shape`] made of a row of processed logits: the distribution the request samples from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shaped {
    /// `temperature == 0`: a point mass on this token (the row is left as it was).
    Greedy(u32),
    /// The row now holds the final probabilities (summing to 1, zero outside top-k/top-p/min-p).
    Probs,
}

/// Samples from `logits` (already processed; consumed as scratch space), drawing one `f64` from `rng`.
pub fn sample(logits: &mut [f32], p: &ValidSamplingParams, rng: &mut impl rand::Rng) -> SampleOutput {
    let u: f64 = rng.random();
    sample_with(logits, p, u)
}

/// [`sample`] with the uniform draw `u` in [0, 1) given: [`shape`], then [`draw`], then [`report`].
pub fn sample_with(logits: &mut [f32], p: &ValidSamplingParams, u: f64) -> SampleOutput {
    let shaped = shape(logits, p);
    let token = match shaped {
        Shaped::Greedy(t) => t,
        Shaped::Probs => draw(logits, u),
    };
    report(logits, shaped, token, p.logprobs)
}

/// Turns processed logits into the distribution the request samples from: greedy (an argmax, decided
/// before any division) or temperature → top-k → softmax → top-p → min-p → renormalised, in place.
/// Speculative verification computes the target distribution through this same function.
pub fn shape(logits: &mut [f32], p: &ValidSamplingParams) -> Shaped {
    if p.temperature == 0.0 {
        return Shaped::Greedy(argmax(logits));
    }
    let inv_t = 1.0 / p.temperature;
    logits.iter_mut().for_each(|l| *l *= inv_t);
    if p.top_k > 0 && (p.top_k as usize) < logits.len() {
        let kth = kth_largest(logits, p.top_k as usize);
        logits
            .iter_mut()
            .filter(|l| **l < kth)
            .for_each(|l| *l = f32::NEG_INFINITY);
    }
    softmax_in_place(logits);
    if p.top_p < 1.0 {
        top_p(logits, p.top_p);
    }
    if p.min_p > 0.0 {
        let cut = p.min_p * logits.iter().cloned().fold(0.0, f32::max);
        logits.iter_mut().filter(|x| **x < cut).for_each(|x| *x = 0.0);
    }
    let total: f64 = logits.iter().map(|&x| x as f64).sum();
    logits.iter_mut().for_each(|x| *x = (*x as f64 / total) as f32);
    Shaped::Probs
}

/// Inverse-CDF draw from `probs` with `u` in [0, 1): walks tokens in index order and returns the first
/// whose cumulative mass exceeds `u` (the last token with mass when rounding leaves `u` beyond the
/// total).
pub fn draw(probs: &[f32], u: f64) -> u32 {
    let mut cum = 0.0f64;
    let mut last_nonzero = 0;
    for (i, &x) in probs.iter().enumerate() {
        if x > 0.0 {
            last_nonzero = i;
            cum += x as f64;
            if cum > u {
                return i as u32;
            }
        }
    }
    last_nonzero as u32
}

/// The chosen token's logprob and the top alternatives under the shaped distribution (for greedy,
/// the softmax of the processed logits, computed only when logprobs were asked for).
pub fn report(logits: &mut [f32], shaped: Shaped, token: u32, logprobs: Option<usize>) -> SampleOutput {
    if let Shaped::Greedy(_) = shaped {
        if logprobs.is_none() {
            // Nobody reads the logprob, so no pass over the vocabulary to normalise it.
            return SampleOutput {
                chosen: TokenLogprob {
                    token,
                    logprob: f32::NAN,
                },
                top: Vec::new(),
            };
        }
        // Greedy's distribution is the processed logits' softmax.
        softmax_in_place(logits);
    }
    output(logits, token, logprobs)
}

/// Index of the largest logit; the lowest index wins ties; NaN never wins (0 when all are NaN).
fn argmax(x: &[f32]) -> u32 {
    let mx = max_lanes(x);
    x.iter().position(|&v| v == mx).unwrap_or(0) as u32
}

fn kth_largest(x: &[f32], k: usize) -> f32 {
    let mut v = x.to_vec();
    let (_, kth, _) = v.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    *kth
}

/// Zeroes every probability outside the smallest set of most likely tokens whose mass reaches `p`.
fn top_p(probs: &mut [f32], p: f32) {
    let mut idx: Vec<u32> = (0..probs.len() as u32)
        .filter(|&i| probs[i as usize] > 0.0)
        .collect();
    idx.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]).then(a.cmp(&b)));
    let mut cum = 0.0f64;
    let mut keep = idx.len();
    for (n, &i) in idx.iter().enumerate() {
        cum += probs[i as usize] as f64;
        if cum >= p as f64 {
            keep = n + 1;
            break;
        }
    }
    for &i in &idx[keep..] {
        probs[i as usize] = 0.0;
    }
}

fn output(probs: &[f32], token: u32, logprobs: Option<usize>) -> SampleOutput {
    let lp = |i: usize| probs[i].ln();
    let chosen = TokenLogprob {
        token,
        logprob: lp(token as usize),
    };
    let top = match logprobs {
        None | Some(0) => Vec::new(),
        Some(n) => {
            let mut idx: Vec<usize> = (0..probs.len()).collect();
            let n = n.min(idx.len());
            idx.select_nth_unstable_by(n - 1, |&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            idx.truncate(n);
            idx.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            idx.into_iter()
                .map(|i| TokenLogprob {
                    token: i as u32,
                    logprob: lp(i),
                })
                .collect()
        }
    };
    SampleOutput { chosen, top }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> ValidSamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p.validate(100).unwrap()
    }

    fn histogram(logits: &[f32], p: &ValidSamplingParams, n: usize) -> Vec<usize> {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut h = vec![0; logits.len()];
        for _ in 0..n {
            h[sample(&mut logits.to_vec(), p, &mut rng).chosen.token as usize] += 1;
        }
        h
    }

    #[test]
    fn greedy_takes_the_lowest_index_among_ties_and_reports_logprobs() {
        let p = params(|p| {
            p.temperature = 0.0;
            p.logprobs = Some(2);
        });
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let out = sample(&mut [1.0, 3.0, 3.0, 0.0], &p, &mut rng);
        assert_eq!(out.chosen.token, 1);
        let z = (1f32.exp() + 2.0 * 3f32.exp() + 1.0).ln();
        assert!((out.chosen.logprob - (3.0 - z)).abs() < 1e-5);
        assert_eq!(out.top.iter().map(|t| t.token).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn a_vanishing_temperature_is_greedy() {
        // 1/1e-39 overflows f32: without the epsilon every logit became ±inf and every token id 0.
        let mut logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
        logits[42] = 3.0;
        logits[7] = 2.9;
        assert_eq!(argmax(&logits), 42);
        for t in [1e-39, 1e-30, 1e-6] {
            let p = params(|p| p.temperature = t);
            assert_eq!(p.temperature, 0.0, "{t} is greedy");
            let h = histogram(&logits, &p, 50);
            assert_eq!(h[42], 50, "temperature {t}: the argmax every time");
        }
    }

    #[test]
    fn filters_restrict_the_support() {
        let logits = [2.0, 1.9, 1.0, 0.0, -1.0];
        let n = 2000;
        assert!(
            histogram(&logits, &params(|_| {}), n).iter().all(|&c| c > 0),
            "plain sampling reaches every token"
        );
        let k2 = histogram(&logits, &params(|p| p.top_k = 2), n);
        assert_eq!(&k2[2..], &[0, 0, 0]);
        // probs ≈ [.41, .37, .15, .06, .02]: top_p 0.5 keeps the token that crosses it (2 tokens).
        let p5 = histogram(&logits, &params(|p| p.top_p = 0.5), n);
        assert!(
            p5[0] > 0 && p5[1] > 0 && p5[2..].iter().all(|&c| c == 0),
            "{p5:?}"
        );
        let tiny_p = histogram(&logits, &params(|p| p.top_p = 0.01), n);
        assert_eq!(tiny_p[0], n, "the most likely token alone crosses a tiny top_p");
        // min_p 0.3: keep tokens with p >= 0.3 × 0.41.
        let mp = histogram(&logits, &params(|p| p.min_p = 0.3), n);
        assert!(mp[2] > 0 && mp[3] == 0 && mp[4] == 0, "{mp:?}");
        // Low temperature sharpens towards the argmax.
        let cold = histogram(&logits, &params(|p| p.temperature = 0.05), n);
        assert!(cold[0] > n * 8 / 10, "{cold:?}");
    }

    #[test]
    fn frequencies_follow_the_distribution() {
        let logits = [0.0, 2f32.ln(), f32::NEG_INFINITY];
        let h = histogram(&logits, &params(|_| {}), 6000);
        assert_eq!(h[2], 0);
        assert!((h[1] as f64 / 6000.0 - 2.0 / 3.0).abs() < 0.03, "{h:?}");
    }

    #[test]
    fn one_draw_per_token_and_seeds_reproduce() {
        let p = params(|p| p.logprobs = Some(1));
        let mut a = ChaCha8Rng::seed_from_u64(42);
        let mut b = ChaCha8Rng::seed_from_u64(42);
        let greedy = params(|p| p.temperature = 0.0);
        sample(&mut [0.0; 10], &greedy, &mut a);
        let _: f64 = b.random();
        let x = sample(&mut [0.0; 10], &p, &mut a);
        let y = sample(&mut [0.0; 10], &p, &mut b);
        assert_eq!(x, y, "greedy consumed exactly one draw");
        assert!((x.chosen.logprob - 0.1f32.ln()).abs() < 1e-5);
    }
}
