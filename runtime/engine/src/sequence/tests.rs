//! `Sequence`: stop handling, seeded sampling, and speculative verification against token-by-token
//! stepping.

use super::*;
use crate::sampling::SamplingParams;
use crate::tokenizer::test_tokenizer::tokenizer;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const END: u32 = 0;

/// Drives a sequence with logits that make `script` the greedy choices; returns (text, reason).
fn run(f: impl FnOnce(&mut SamplingParams), script: &[u32]) -> (Vec<String>, Option<FinishReason>, Vec<u32>) {
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

#[test]
fn position_keyed_uniforms_are_the_old_sequential_stream() {
    let t = tokenizer();
    let s = Sequence::new(
        &[1],
        SamplingParams {
            seed: Some(77),
            ..SamplingParams::default()
        }
        .validate(t.vocab_size())
        .unwrap(),
        &[END],
        100,
    );
    let mut seq = ChaCha8Rng::seed_from_u64(77);
    for n in 0..40 {
        let want: f64 = seq.random();
        assert_eq!(s.uniform(Stream::Sample, n), want, "position {n}");
    }
    // The other streams are other numbers.
    assert_ne!(s.uniform(Stream::Accept, 0), s.uniform(Stream::Sample, 0));
    assert_ne!(s.uniform(Stream::Draft, 0), s.uniform(Stream::Accept, 0));
}

/// Rows of logits for a scripted run: row `i` has `script[i]` first and a spread of others behind it.
fn scripted_rows(vocab: usize, script: &[u32]) -> Vec<f32> {
    script
        .iter()
        .flat_map(|&want| {
            (0..vocab).map(move |j| {
                if j == want as usize {
                    4.0
                } else {
                    ((j * 31 + want as usize * 7) % 11) as f32 * 0.3
                }
            })
        })
        .collect()
}

/// Verifies `drafts` against `rows` in one call, and steps the same rows one by one in a twin; the
/// twin's events up to the verified count must be the same.
fn verify_against_steps(params: SamplingParams, rows: &[f32], drafts: &[u32]) -> Verified {
    let t = tokenizer();
    let vocab = t.vocab_size();
    let p = params.validate(vocab).unwrap();
    let mut spec = Sequence::new(&[1, 2], p.clone(), &[END], 1000);
    let mut plain = Sequence::new(&[1, 2], p, &[END], 1000);
    let ds: Vec<DraftToken> = drafts
        .iter()
        .map(|&token| DraftToken { token, q: None })
        .collect();
    let v = spec.verify(&t, rows, vocab, &ds, Rule::Exact).unwrap();
    for (i, ev) in v.events.iter().enumerate() {
        let want = plain.step(&t, &rows[i * vocab..(i + 1) * vocab]).unwrap();
        assert_eq!(ev, &want, "event {i}");
    }
    assert_eq!(spec.output(), plain.output());
    assert_eq!(spec.finished(), plain.finished());
    v
}

#[test]
fn verification_commits_what_stepping_commits_and_stops_where_it_stops() {
    let t = tokenizer();
    let vocab = t.vocab_size();
    let script = ids("abcdef");
    let rows = scripted_rows(vocab, &script);
    // All four drafts right: 4 accepted plus the bonus token.
    let v = verify_against_steps(SamplingParams::greedy(50), &rows, &script[..4]);
    assert_eq!((v.accepted, v.events.len()), (4, 5));
    // A wrong third draft: two accepted, then the correction (the script's token).
    let mut wrong = script[..4].to_vec();
    wrong[2] = ids("z")[0];
    let v = verify_against_steps(SamplingParams::greedy(50), &rows, &wrong);
    assert_eq!((v.accepted, v.events.len()), (2, 3));
    assert_eq!(v.events[2].token, script[2]);
    // max_tokens inside the run: it ends after the third token, accepted or not.
    let v = verify_against_steps(SamplingParams::greedy(3), &rows, &script[..4]);
    assert_eq!(v.events.len(), 3);
    assert_eq!(v.events[2].finish, Some(FinishReason::Length));
    // A stop string across the accepted tokens: cut exactly there.
    let stop = SamplingParams {
        stop: vec!["cd".into()],
        ..SamplingParams::greedy(50)
    };
    let v = verify_against_steps(stop, &rows, &script[..4]);
    assert_eq!(v.events.last().unwrap().finish, Some(FinishReason::Stop));
    assert_eq!(v.events.iter().map(|e| e.text.as_str()).collect::<String>(), "ab");
    // A stop token id and EOS inside the run.
    let c = ids("c")[0];
    let v = verify_against_steps(
        SamplingParams {
            stop_token_ids: vec![c],
            ..SamplingParams::greedy(50)
        },
        &rows,
        &script[..4],
    );
    assert_eq!(v.events.len(), 3);
    let mut with_eos = script.clone();
    with_eos[1] = END;
    let rows_eos = scripted_rows(vocab, &with_eos);
    let v = verify_against_steps(SamplingParams::greedy(50), &rows_eos, &with_eos[..4]);
    assert_eq!(
        (v.events.len(), v.events[1].finish),
        (2, Some(FinishReason::Stop))
    );
    // min_tokens masks that EOS: the target's token differs from the draft, which is rejected.
    let v = verify_against_steps(
        SamplingParams {
            min_tokens: 3,
            ..SamplingParams::greedy(50)
        },
        &rows_eos,
        &with_eos[..4],
    );
    assert_eq!(v.accepted, 1);
}

#[test]
fn sampled_point_mass_verification_matches_seeded_stepping_with_logprobs() {
    let t = tokenizer();
    let vocab = t.vocab_size();
    let script = ids("hello world");
    let rows = scripted_rows(vocab, &script);
    for seed in 0..50 {
        let params = SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            repetition_penalty: 1.3,
            seed: Some(seed),
            logprobs: Some(2),
            max_tokens: Some(50),
            ..SamplingParams::default()
        };
        verify_against_steps(params, &rows, &script[..5]);
    }
}

#[test]
fn draft_proposals_are_shaped_like_the_target() {
    let t = tokenizer();
    let vocab = t.vocab_size();
    let rows = scripted_rows(vocab, &ids("ab"));
    let greedy = Sequence::new(
        &[1],
        SamplingParams::greedy(9).validate(vocab).unwrap(),
        &[END],
        100,
    );
    assert_eq!(
        greedy.propose(&rows[..vocab], &[]),
        DraftToken {
            token: ids("a")[0],
            q: None
        }
    );
    let sampled = Sequence::new(
        &[1],
        SamplingParams {
            temperature: 0.5,
            top_k: 3,
            seed: Some(1),
            ..SamplingParams::default()
        }
        .validate(vocab)
        .unwrap(),
        &[END],
        100,
    );
    let distinct: Vec<f32> = (0..vocab).map(|j| j as f32 * 0.01).collect();
    let d = sampled.propose(&distinct, &[5]);
    let q = d.q.expect("a sampled proposal carries its distribution");
    assert_eq!(q.iter().filter(|&&x| x > 0.0).count(), 3, "top-k applies");
    assert!(q[d.token as usize] > 0.0);
    assert!((q.iter().map(|&x| x as f64).sum::<f64>() - 1.0).abs() < 1e-5);
    // The same position gives the same draw.
    assert_eq!(sampled.propose(&distinct, &[5]).token, d.token);
}

/// A sequence under the regex `ab[0-9]{3}` on the byte-level test tokenizer.
fn constrained(max_tokens: usize) -> SamplingParams {
    let t = tokenizer();
    let gs = crate::constraint::Grammars::new(
        &t,
        t.vocab_size(),
        &[END],
        crate::constraint::GrammarLimits::default(),
    )
    .unwrap();
    let g = gs
        .compile(&crate::constraint::ConstraintSpec::Regex("ab[0-9]{3}".into()))
        .unwrap();
    SamplingParams {
        constraint: Some(g),
        ..SamplingParams::greedy(max_tokens)
    }
}

#[test]
fn constrained_verification_masks_each_row_like_stepping() {
    let t = tokenizer();
    let vocab = t.vocab_size();
    // Unmasked, the rows say "abcdef"; the grammar allows only digits after "ab", so from the third
    // row on the masked argmax is whatever digit scores highest in that row.
    let script = ids("abcdef");
    let rows = scripted_rows(vocab, &script);
    // Drafts that follow the raw rows: "a", "b" accepted, "c" refused by the grammar (p = 0), the
    // correction is the masked argmax — exactly what stepping commits.
    let v = verify_against_steps(constrained(50), &rows, &script[..4]);
    assert_eq!((v.accepted, v.events.len()), (2, 3));
    let third = t.decode(&[v.events[2].token], false).unwrap();
    assert!(third.chars().all(|c| c.is_ascii_digit()), "{third:?}");
    // Drafts that follow the grammar: all accepted, and the grammar completes inside the run.
    let mut plain = Sequence::new(&[1, 2], constrained(50).validate(vocab).unwrap(), &[END], 1000);
    let want: Vec<u32> = (0..5)
        .map(|i| plain.step(&t, &rows[i * vocab..(i + 1) * vocab]).unwrap().token)
        .collect();
    assert_eq!(plain.finished(), Some(FinishReason::Stop), "the grammar ends it");
    let v = verify_against_steps(constrained(50), &rows, &want);
    assert_eq!(v.events.iter().map(|e| e.token).collect::<Vec<_>>(), want);
    assert_eq!(v.events[4].finish, Some(FinishReason::Stop));
    assert_eq!(v.error, None);
}

#[test]
fn draft_proposals_for_constrained_requests_are_masked_and_leave_the_grammar_alone() {
    let t = tokenizer();
    let vocab = t.vocab_size();
    let mut s = Sequence::new(&[1, 2], constrained(50).validate(vocab).unwrap(), &[END], 1000);
    let rows = scripted_rows(vocab, &ids("abc"));
    // After drafts "ab", the draft model's favourite "c" is masked: the proposal is a digit.
    let d = s.propose(&rows[2 * vocab..], &ids("ab"));
    let text = t.decode(&[d.token], false).unwrap();
    assert!(text.chars().all(|c| c.is_ascii_digit()), "{text:?}");
    // A draft the grammar refuses leaves the proposal unmasked (still exact: the verifier masks p).
    assert_eq!(s.propose(&rows[2 * vocab..], &ids("xb")).token, ids("c")[0]);
    // The committed state never saw a draft: stepping still starts at "a".
    assert_eq!(s.step(&t, &rows[..vocab]).unwrap().token, ids("a")[0]);
}
