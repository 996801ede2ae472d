//! The constraint module on the byte-level test tokenizer: masks drive random walks that must end in
//! valid output; the cache, rollback, the live count and refusals.

use super::*;
use crate::tokenizer::test_tokenizer::tokenizer;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

const EOS: u32 = 0;

fn grammars() -> (Tokenizer, Grammars) {
    let t = tokenizer();
    let g = Grammars::new(&t, t.vocab_size(), &[EOS], GrammarLimits::default()).unwrap();
    (t, g)
}

/// Walks the grammar choosing uniformly among allowed tokens (EOS only when nothing else is allowed,
/// so walks are long); returns the text and whether it ended by the grammar (not by the step bound).
fn walk(t: &Tokenizer, g: &CompiledGrammar, seed: u64, max: usize) -> (String, bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut s = g.start();
    let mut out = Vec::new();
    for _ in 0..max {
        if s.is_finished() {
            return (t.decode(&out, false).unwrap(), true);
        }
        let mut row = vec![0.0f32; g.vocab_size()];
        s.mask(&mut row).unwrap();
        let allowed: Vec<u32> = (0..row.len() as u32)
            .filter(|&i| row[i as usize] == 0.0 && i != EOS)
            .collect();
        if allowed.is_empty() {
            assert!(s.allows(EOS).unwrap(), "nothing allowed, not even EOS");
            return (t.decode(&out, false).unwrap(), true);
        }
        // Prefer short tokens half the time so structures close.
        let tok = allowed[rng.random_range(0..allowed.len())];
        s.commit(tok).unwrap();
        out.push(tok);
    }
    (t.decode(&out, false).unwrap(), false)
}

#[test]
fn json_schema_walks_give_compact_valid_instances() {
    let (t, gs) = grammars();
    let schema = json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 3, "maximum": 7},
            "tag": {"enum": ["x", "yy"]},
            "ok": {"type": "boolean"}
        },
        "required": ["n", "tag", "ok"],
        "additionalProperties": false
    });
    let g = gs.compile(&ConstraintSpec::JsonSchema(schema)).unwrap();
    for seed in 0..20 {
        let (text, done) = walk(&t, &g, seed, 200);
        assert!(done, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let n = v["n"].as_i64().unwrap();
        assert!((3..=7).contains(&n), "{text}");
        assert!(["x", "yy"].contains(&v["tag"].as_str().unwrap()), "{text}");
        assert!(v["ok"].is_boolean());
        assert!(!text.contains(' ') && !text.contains('\n'), "compact: {text:?}");
    }
}

#[test]
fn regex_and_choice_walks_match() {
    let (t, gs) = grammars();
    let rx = gs
        .compile(&ConstraintSpec::Regex("[a-c]{2,4}-[0-9]".into()))
        .unwrap();
    let choice = gs
        .compile(&ConstraintSpec::Choice(vec![
            "hello".into(),
            "help".into(),
            "\"quoted\"".into(),
        ]))
        .unwrap();
    for seed in 0..30 {
        let (text, done) = walk(&t, &rx, seed, 50);
        assert!(done, "{text}");
        let (head, digit) = text.split_once('-').unwrap();
        assert!(
            (2..=4).contains(&head.len()) && head.chars().all(|c| ('a'..='c').contains(&c)),
            "{text}"
        );
        assert!(
            digit.len() == 1 && digit.chars().all(|c| c.is_ascii_digit()),
            "{text}"
        );
        let (text, done) = walk(&t, &choice, seed, 50);
        assert!(
            done && ["hello", "help", "\"quoted\""].contains(&text.as_str()),
            "{text}"
        );
    }
}

#[test]
fn the_cache_compiles_once_and_keeps_the_bound() {
    let t = tokenizer();
    let limits = GrammarLimits {
        cache_entries: 2,
        ..GrammarLimits::default()
    };
    let gs = Grammars::new(&t, t.vocab_size(), &[EOS], limits).unwrap();
    let spec = |i: usize| ConstraintSpec::Regex(format!("a{{{i}}}"));
    let a = gs.compile(&spec(1)).unwrap();
    let b = gs.compile(&spec(1)).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    gs.compile(&spec(2)).unwrap();
    gs.compile(&spec(3)).unwrap();
    assert_eq!(gs.cached(), 2);
    assert_eq!(
        gs.counters(),
        GrammarCounters {
            compiled: 3,
            hits: 1,
            errors: 0
        }
    );
    let c = gs.compile(&spec(1)).unwrap();
    assert!(!Arc::ptr_eq(&a, &c), "evicted, compiled again");
}

#[test]
fn rollback_restores_the_mask_and_states_are_counted() {
    let (t, gs) = grammars();
    let g = gs.compile(&ConstraintSpec::Regex("(ab|ac)d".into())).unwrap();
    let mut s = g.start();
    assert_eq!(gs.live_states(), 1);
    let mask = |s: &mut GrammarState| {
        let mut row = vec![0.0f32; g.vocab_size()];
        s.mask(&mut row).unwrap();
        row
    };
    let first = mask(&mut s);
    let a = t.encode("a", false).unwrap()[0];
    let c = t.encode("c", false).unwrap()[0];
    let d = t.encode("d", false).unwrap()[0];
    s.commit(a).unwrap();
    s.commit(c).unwrap();
    assert!(s.allows(d).unwrap());
    s.rollback(2).unwrap();
    assert_eq!(mask(&mut s), first);
    assert!(s.rollback(1).is_err(), "nothing left to take back");
    s.commit(a).unwrap();
    assert!(s.commit(d).is_err(), "d cannot follow a");
    let other = g.start();
    assert_eq!(gs.live_states(), 2);
    drop((s, other));
    assert_eq!(gs.live_states(), 0);
}

#[test]
fn bad_constraints_are_refused_with_the_reason() {
    let (_, gs) = grammars();
    let e = |spec: ConstraintSpec| gs.compile(&spec).err().unwrap().to_string();
    assert!(
        e(ConstraintSpec::Regex("a(b".into()))
            .to_lowercase()
            .contains("regex"),
        "{}",
        e(ConstraintSpec::Regex("a(b".into()))
    );
    let m = e(ConstraintSpec::JsonSchema(
        json!({"type": "object", "uniqueItems": true}),
    ));
    assert!(m.contains("uniqueItems"), "{m}");
    let m = e(ConstraintSpec::JsonSchema(
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
    ));
    assert!(!m.is_empty());
    let m = e(ConstraintSpec::Lark("start: foo".into()));
    assert!(m.contains("foo"), "{m}");
    assert_eq!(gs.counters().errors, 4);
    assert_eq!(gs.cached(), 0);
}
