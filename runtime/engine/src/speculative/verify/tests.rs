//! The verifier on synthetic target and draft distributions: whole speculative runs over a Markov
//! "model" (each position's `p` and `q` depend on the previous token), repeated 20,000 times with fixed
//! seeds, must reproduce the target's exact marginal at every position (chi-square goodness of fit);
//! the same statistic rejects the deliberately wrong rule that resamples from `p` after a rejection.

use super::*;
use crate::sampling::{SamplingParams, sample_with, shape};
use crate::speculative::stats::{ChiSquare, goodness_of_fit};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Level 1e-4, one-sided.
const Z: f64 = 3.719;
const V: usize = 8;
const POSITIONS: usize = 4;
const DRAWS: usize = 20_000;

/// `table[pos][prev]` is a distribution over `V` tokens.
type Table = Vec<Vec<[f64; V]>>;

fn normalise(w: [f64; V]) -> [f64; V] {
    let s: f64 = w.iter().sum();
    w.map(|x| x / s)
}

/// Random conditional distributions; `sharp` raises the weights to a power (peakier rows), `zeros`
/// leaves tokens out of the support.
fn table(seed: u64, sharp: i32, zeros: bool) -> Table {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..POSITIONS)
        .map(|_| {
            (0..V)
                .map(|_| {
                    normalise(std::array::from_fn(|i| {
                        let w: f64 = rng.random::<f64>().powi(sharp);
                        if zeros && i % 3 == 0 { 0.0 } else { w }
                    }))
                })
                .collect()
        })
        .collect()
}

/// The exact marginal of the token at each position (start: token 0 before position 0).
fn marginals(p: &Table) -> Vec<[f64; V]> {
    let mut prev = [0.0; V];
    prev[0] = 1.0;
    let mut out = Vec::new();
    for pos in p {
        let mut m = [0.0; V];
        for (a, &wa) in prev.iter().enumerate() {
            for (b, &pb) in pos[a].iter().enumerate() {
                m[b] += wa * pb;
            }
        }
        out.push(m);
        prev = m;
    }
    out
}

fn f32s(x: &[f64; V]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// How drafts are proposed in a simulated run.
#[derive(Clone, Copy)]
enum Drafts {
    /// Sampled from the draft table, verified against its distribution.
    Distribution,
    /// Sampled from the draft table but verified as point masses.
    PointMass,
}

/// Draws `DRAWS` sequences of `POSITIONS` tokens by speculative runs of up to `k` drafts and returns
/// the count of each token at each position.
fn simulate(p: &Table, q: &Table, k: usize, drafts: Drafts, rule: Rule, seed: u64) -> Vec<[u64; V]> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut counts = vec![[0u64; V]; POSITIONS];
    for _ in 0..DRAWS {
        let mut seq: Vec<u32> = Vec::new();
        while seq.len() < POSITIONS {
            // Draft up to k tokens from q, each continuing the previous draft.
            let mut proposed = Vec::new();
            let mut prev = seq.last().copied().unwrap_or(0);
            for i in 0..k.min(POSITIONS - seq.len()) {
                let qrow = f32s(&q[seq.len() + i][prev as usize]);
                let d = crate::sampling::draw(&qrow, rng.random());
                proposed.push((d, qrow));
                prev = d;
            }
            let mut all_accepted = true;
            for (d, qrow) in &proposed {
                let prev = seq.last().copied().unwrap_or(0) as usize;
                let target = f32s(&p[seq.len()][prev]);
                let qd = match drafts {
                    Drafts::Distribution => Some(qrow.as_slice()),
                    Drafts::PointMass => None,
                };
                let v = verify(&target, Shaped::Probs, *d, qd, rng.random(), rng.random(), rule);
                seq.push(v.token);
                if !v.accepted {
                    all_accepted = false;
                    break;
                }
            }
            // Every draft accepted: the bonus token from the next position's p.
            if all_accepted && seq.len() < POSITIONS {
                let prev = seq.last().copied().unwrap_or(0) as usize;
                let target = f32s(&p[seq.len()][prev]);
                seq.push(crate::sampling::draw(&target, rng.random()));
            }
        }
        for (pos, &t) in seq.iter().take(POSITIONS).enumerate() {
            counts[pos][t as usize] += 1;
        }
    }
    counts
}

fn fit(counts: &[[u64; V]], p: &Table) -> Vec<ChiSquare> {
    counts
        .iter()
        .zip(marginals(p))
        .map(|(c, m)| goodness_of_fit(c, &m))
        .collect()
}

#[test]
fn exact_rule_reproduces_the_target_at_every_position() {
    let p = table(1, 2, false);
    let cases: Vec<(&str, Table, usize, Drafts)> = vec![
        ("close draft", table(1, 2, false), 3, Drafts::Distribution),
        ("unrelated draft", table(2, 1, false), 3, Drafts::Distribution),
        (
            "bad draft (peaky, own support)",
            table(3, 6, true),
            3,
            Drafts::Distribution,
        ),
        ("one draft", table(4, 3, false), 1, Drafts::Distribution),
        ("point masses", table(5, 4, false), 3, Drafts::PointMass),
    ];
    for (name, q, k, drafts) in cases {
        let counts = simulate(&p, &q, k, drafts, Rule::Exact, 42);
        for (pos, t) in fit(&counts, &p).iter().enumerate() {
            assert!(
                !t.rejects(Z),
                "{name}: position {pos}: χ² {:.1} > {:.1} (df {})",
                t.statistic,
                t.critical(Z),
                t.df
            );
        }
    }
}

#[test]
fn negative_control_the_statistic_detects_resampling_from_the_target() {
    let p = table(1, 2, false);
    for (name, q, drafts) in [
        ("bad draft", table(3, 6, true), Drafts::Distribution),
        ("point masses", table(5, 4, false), Drafts::PointMass),
    ] {
        let counts = simulate(&p, &q, 3, drafts, Rule::ResampleTarget, 42);
        let first = &fit(&counts, &p)[0];
        assert!(
            first.rejects(Z),
            "{name}: the wrong rule went unnoticed: χ² {:.1} <= {:.1}",
            first.statistic,
            first.critical(Z)
        );
    }
}

#[test]
fn point_masses_commit_the_token_ordinary_sampling_draws() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let params = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        ..SamplingParams::default()
    }
    .validate(16)
    .unwrap();
    for _ in 0..2000 {
        let logits: Vec<f32> = (0..16).map(|_| rng.random::<f32>() * 4.0).collect();
        let u: f64 = rng.random();
        let want = sample_with(&mut logits.clone(), &params, u).chosen.token;
        let mut row = logits.clone();
        let shaped = shape(&mut row, &params);
        let draft = rng.random_range(0..16);
        let v = verify(&row, shaped, draft, None, rng.random(), u, Rule::Exact);
        assert_eq!(v.token, want);
        assert_eq!(v.accepted, draft == want);
    }
}

#[test]
fn greedy_targets_accept_only_their_argmax() {
    let q = [0.25f32; 4];
    let row = [0.0f32, 3.0, 1.0, 3.0];
    for d in 0..4 {
        for qd in [None, Some(&q[..])] {
            let v = verify(&row, Shaped::Greedy(1), d, qd, 0.5, 0.5, Rule::Exact);
            assert_eq!(
                v,
                Verdict {
                    token: 1,
                    accepted: d == 1
                }
            );
        }
    }
}

#[test]
fn correction_draws_from_the_residual_and_falls_back_when_p_equals_q() {
    let p = [0.5f32, 0.5, 0.0];
    let q = [0.9f32, 0.1, 0.0];
    // Residual = [0, 0.4, 0]: every rejection gives token 1.
    for u in [0.0, 0.3, 0.99] {
        assert_eq!(correction(&p, &q, u), Some(1));
    }
    assert_eq!(correction(&p, &p, 0.5), None);
    // A draft its own distribution gave no mass is verified as a point mass.
    let v = verify(&p, Shaped::Probs, 2, Some(&q), 0.0, 0.2, Rule::Exact);
    assert_eq!(
        v,
        Verdict {
            token: 0,
            accepted: false
        }
    );
}
