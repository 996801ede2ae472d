//! The step-cost gate on synthetic step times.

use super::*;

/// Feeds steps of 1..=max positions timed by `t`.
fn measured(t: impl Fn(usize) -> f64, max: usize) -> StepCost {
    let mut c = StepCost::default();
    for i in 0..100 {
        let n = 1 + i % max;
        c.observe(n, t(n));
    }
    c
}

fn seqs(n: usize, per_token: f64, k: usize) -> Vec<Candidate> {
    vec![
        Candidate {
            per_token,
            k,
            behind: 0,
            remaining: 1000,
        };
        n
    ]
}

/// 160 decisions, exploration included: how often each pattern of kept drafts came out.
fn decisions(
    c: &mut StepCost,
    positions: usize,
    decoding: usize,
    cands: &[Candidate],
) -> Vec<(Vec<usize>, usize)> {
    let mut seen: Vec<(Vec<usize>, usize)> = Vec::new();
    for _ in 0..160 {
        let keep = c.choose(positions, decoding, cands);
        match seen.iter_mut().find(|(k, _)| *k == keep) {
            Some((_, n)) => *n += 1,
            None => seen.push((keep, 1)),
        }
    }
    seen.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    seen
}

#[test]
fn the_fit_recovers_a_line() {
    let c = measured(|n| 0.010 + 0.0005 * n as f64, 40);
    let (a, b) = c.fit().unwrap();
    assert!((a - 0.010).abs() < 1e-9 && (b - 0.0005).abs() < 1e-9, "{a} {b}");
}

#[test]
fn memory_bound_steps_speculate_and_compute_bound_ones_do_not() {
    // Weight reads dominate (10 ms a step, 0.1 ms a position): 1 sequence, 4 drafts of which even
    // the 4th (worth 0.5⁴) pays.
    let mut c = measured(|n| 0.010 + 0.0001 * n as f64, 80);
    assert_eq!(decisions(&mut c, 1, 1, &seqs(1, 0.5, 4)), vec![(vec![4], 160)]);
    // Arithmetic dominates (1 ms a position): 16 sequences accepting half their drafts. A draft
    // costs what a real token does and yields at most half of one: only exploration drafts, one
    // sequence at a time, every 16th decision.
    let mut c = measured(|n| 0.0005 + 0.001 * n as f64, 80);
    let mut explore = vec![0; 16];
    explore[15] = 4;
    assert_eq!(
        decisions(&mut c, 16, 16, &seqs(16, 0.5, 4)),
        vec![(vec![0; 16], 150), (explore, 10)]
    );
}

#[test]
fn in_a_compute_bound_batch_only_the_sequences_that_accept_draft() {
    // 4 ms fixed, 1 ms a position, 16 sequences: a draft pays when its worth is above ~0.8 tokens.
    let mut c = measured(|n| 0.004 + 0.001 * n as f64, 80);
    let mut cands = seqs(15, 0.3, 4);
    cands.insert(
        3,
        Candidate {
            per_token: 0.98,
            k: 4,
            behind: 0,
            remaining: 1000,
        },
    );
    let mut want = vec![0; 16];
    want[3] = 4;
    assert_eq!(decisions(&mut c, 16, 16, &cands), vec![(want.clone(), 160)]);
    // Everyone accepting nearly everything: everyone drafts.
    assert_eq!(
        decisions(&mut c, 16, 16, &seqs(16, 0.99, 4)),
        vec![(vec![4; 16], 160)]
    );
    // With 10 ms fixed a draft pays above ~0.62 tokens, a little more as the step's yield rises: a
    // sequence accepting 9 in 10 keeps 4 of its 6 drafts (0.9⁴ = 0.66 pays, 0.9⁵ = 0.59 not).
    let mut c = measured(|n| 0.010 + 0.001 * n as f64, 80);
    cands[3] = Candidate {
        per_token: 0.9,
        k: 6,
        behind: 0,
        remaining: 1000,
    };
    assert_eq!(decisions(&mut c, 16, 16, &cands), vec![(want, 160)]);
}

#[test]
fn a_draft_model_dearer_than_the_target_does_not_pay_nor_explore() {
    // Memory-bound target: 20 ms a step. Draft passes of one token costing 21 ms each, every draft
    // accepted: each yields a token for more than a token's time, so even perfect acceptance does
    // not pay, and exploring would learn nothing.
    let mut c = measured(|n| 0.020 + 0.00001 * n as f64, 8);
    for _ in 0..10 {
        c.observe_draft(1, 0.021);
    }
    assert_eq!(decisions(&mut c, 1, 1, &seqs(1, 1.0, 3)), vec![(vec![0], 160)]);
    // A draft at a tenth of the target's cost pays.
    let mut c = measured(|n| 0.020 + 0.00001 * n as f64, 8);
    for _ in 0..10 {
        c.observe_draft(1, 0.002);
    }
    assert_eq!(decisions(&mut c, 1, 1, &seqs(1, 0.8, 3)), vec![(vec![3], 160)]);
}

#[test]
fn a_draft_models_catch_up_is_priced_apart_from_its_drafts() {
    // Draft passes: 10 ms fixed, 0.5 ms a fed token (measured over passes of 1..20 tokens).
    let mut c = measured(|n| 0.020 + 0.00001 * n as f64, 8);
    for i in 0..40 {
        let n = 1 + i % 20;
        c.observe_draft(n, 0.010 + 0.0005 * n as f64);
    }
    // Caught up, a sequence accepting 9 in 10 drafts all 3: each costs ~10.5 ms and is worth
    // 0.9, 0.81, 0.73 of a 20 ms token.
    let caught_up = Candidate {
        per_token: 0.9,
        k: 3,
        behind: 0,
        remaining: 4,
    };
    assert_eq!(decisions(&mut c, 1, 1, &[caught_up]), vec![(vec![3], 160)]);
    // 40 tokens behind (20 ms of catch-up) with 4 tokens left (about one step to share it): its
    // first draft no longer pays, but perfectly accepted drafts would, so it explores.
    let behind = Candidate {
        behind: 40,
        ..caught_up
    };
    assert_eq!(
        decisions(&mut c, 1, 1, &[behind]),
        vec![(vec![0], 150), (vec![3], 10)]
    );
    // 100 behind (50 ms): not even perfect acceptance would pay for the catch-up.
    let far = Candidate {
        behind: 100,
        ..caught_up
    };
    assert_eq!(decisions(&mut c, 1, 1, &[far]), vec![(vec![0], 160)]);
    // The same catch-up shared by the ~290 steps of 1,000 tokens left pays.
    let long = Candidate {
        remaining: 1000,
        ..far
    };
    assert_eq!(decisions(&mut c, 1, 1, &[long]), vec![(vec![3], 160)]);
}

#[test]
fn prefill_steps_price_verification_until_decode_steps_show_a_slope() {
    // Plain steps of 20 ms, all of one size: no slope of their own. A cheap draft model (2 ms a
    // pass, 0.5 ms a fed token) and a caught-up sequence accepting 9 in 10.
    let mut c = StepCost::default();
    for _ in 0..10 {
        c.observe(1, 0.020);
        c.observe_draft(1, 0.0025);
        c.observe_draft(5, 0.0045);
    }
    let cand = [Candidate {
        per_token: 0.9,
        k: 3,
        behind: 0,
        remaining: 1000,
    }];
    // Verification priced at nothing: every draft pays.
    assert_eq!(c.choose(1, 1, &cand), vec![3]);
    // Prefill chunks at 20 ms a position: a draft would cost more than the token it may bring,
    // and not even perfect acceptance would pay.
    for _ in 0..3 {
        c.observe_prefill(100, 0.020 * 100.0);
        c.observe_prefill(50, 0.020 * 50.0);
    }
    assert_eq!(decisions(&mut c, 1, 1, &cand), vec![(vec![0], 160)]);
}

#[test]
fn exploration_follows_16_decisions_without_paying_drafts_and_the_last_slope_is_kept() {
    let mut c = measured(|n| 0.0005 + 0.001 * n as f64, 80);
    let bad = seqs(4, 0.2, 4);
    let explored_at = |c: &mut StepCost, n: usize| -> Vec<usize> {
        (1..=n)
            .filter(|_| c.choose(4, 4, &bad).iter().any(|&k| k > 0))
            .collect()
    };
    assert_eq!(explored_at(&mut c, 100), vec![16, 32, 48, 64, 80, 96]);
    // A decision whose drafts pay restarts the count.
    assert_eq!(explored_at(&mut c, 10), Vec::<usize>::new());
    assert_eq!(c.choose(4, 4, &seqs(4, 1.0, 4)), vec![4; 4]);
    assert_eq!(explored_at(&mut c, 40), vec![16, 32]);
    // A thousand steps of one size: the fit has no slope, and the last one prices the drafts.
    for _ in 0..1000 {
        c.observe(4, 0.0045);
    }
    assert!(c.fit().is_none());
    assert_eq!(c.choose(4, 4, &bad), vec![0; 4]);
    assert_eq!(c.choose(4, 4, &seqs(4, 1.0, 4)), vec![4; 4]);
}

#[test]
fn the_deployment_prior_follows_verified_runs() {
    let mut c = StepCost::default();
    assert_eq!(c.prior(), FIRST_PRIOR);
    c.observe_run(4, 4);
    assert_eq!(c.prior(), 1.0);
    // 4 accepted of 4 trials, then 1 accepted and a rejection (decayed once).
    c.observe_run(4, 1);
    let (a, n) = (4.0 * KEEP_RUNS + 1.0, 4.0 * KEEP_RUNS + 2.0);
    assert!((c.prior() - a / n).abs() < 1e-12);
    c.observe_run(0, 0);
    assert!((c.prior() - a / n).abs() < 1e-12);
}

#[test]
fn without_measurements_it_speculates_and_probes_an_unknown_slope() {
    let mut c = StepCost::default();
    // Nothing measured: every draft, even of a sequence never accepting.
    assert_eq!(c.choose(16, 16, &seqs(16, 0.0, 4)), vec![4; 16]);
    // All steps the same size: no slope, so verification is priced at nothing and every draft
    // with a chance pays — but every 16th step decodes plainly to show the slope.
    for _ in 0..50 {
        c.observe(20, 0.02);
    }
    assert!(c.fit().is_none());
    let cands = seqs(4, 0.3, 4);
    assert_eq!(
        decisions(&mut c, 4, 4, &cands),
        vec![(vec![4; 4], 150), (vec![0; 4], 10)]
    );
    // One plain step of 4 positions shows it: t(n) = 0.001·n, a compute-bound step where a draft
    // worth 0.3 does not pay.
    for _ in 0..10 {
        c.observe(4, 0.004);
        c.observe(20, 0.02);
    }
    assert!(c.fit().is_some());
    assert_eq!(c.choose(4, 4, &cands), vec![0; 4]);
    // Nonsense measurements are ignored.
    c.observe(0, 1.0);
    c.observe(4, f64::NAN);
    c.observe(4, -1.0);
    assert_eq!(c.target.samples, 70);
}
