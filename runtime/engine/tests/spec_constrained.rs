//! Speculative decoding of structured-output (JSON-schema-constrained) requests, through the real step
//! loop on generated models (random weights, so the grammar alone makes the output valid):
//!
//! - greedy: with n-gram and draft-model speculation (the model drafting for itself, and a model with
//!   other weights) every token equals speculation off, alone and in a mixed batch with unconstrained
//!   requests, and every constrained output is a valid instance of the schema;
//! - seeded sampled constrained requests give the tokens of speculation off with n-gram drafts, and
//!   valid, batch-independent outputs with a draft model;
//! - speculation really ran for the constrained requests (drafts proposed and accepted), and the
//!   grammar states are all released at the end.
//!
//! The served path (`serve --speculative-config` with a `response_format`, and its counters) is
//! `runtime/server/tests/spec_constrained.rs`.
//!
//! Without the grammar mask on each verification row, the verifier would accept or correct to tokens
//! the grammar refuses (the first such commit fails the request), and greedy equality breaks.

mod common;
use common::collect;

use modelfleet_testkit::fixtures::{OBJECT_SCHEMA, check_object_instance};

use modelfleet_engine::constraint::{CompiledGrammar, ConstraintSpec, GrammarLimits, Grammars};
use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sched::{
    EngineHandle, Finished, QueueLimits, Request, RequestStream, SchedulerConfig, TenantLimits,
};
use modelfleet_engine::speculative::SpecConfig;
use modelfleet_engine::speculative::SpecCounters;
use modelfleet_engine::stop::FinishReason;
use modelfleet_engine::{Engine, EngineConfig, ModelDir};
use modelfleet_testkit::gen_model::{GenDType, GenFormat, Shape};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The tiny Llama with random weights from `seed`.
fn generated(seed: u64) -> tempfile::TempDir {
    common::generated(Shape::Tiny, seed, GenDType::F32, GenFormat::Safetensors)
}

fn start(target: &Path, draft: Option<&Path>, spec: Option<SpecConfig>) -> EngineHandle {
    let (target, draft) = (target.to_path_buf(), draft.map(Path::to_path_buf));
    EngineHandle::start(
        move || {
            let cfg = EngineConfig {
                threads: 1,
                block_size: 16,
                num_kv_blocks: Some(256),
                max_model_len: Some(256),
                ..EngineConfig::default()
            };
            let mut e = Engine::load(&target, &cfg)?;
            if let Some(d) = draft {
                e.attach_draft(ModelDir::open(&d)?, 256 + 64)?;
            }
            Ok(e)
        },
        SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 256,
            speculative: spec,
            ..SchedulerConfig::default()
        },
        QueueLimits {
            max_queued_requests: 1000,
            max_queued_tokens: 1_000_000,
        },
    )
    .unwrap()
}

/// A request mix: constrained (greedy and seeded) ones whose prompts quote schema instances (so the
/// n-gram lookup has something to draft from), and unconstrained ones beside them.
struct Case {
    prompt: String,
    params: SamplingParams,
    constrained: bool,
}

fn cases(g: &Arc<CompiledGrammar>) -> Vec<Case> {
    let quoted = |i: u32| {
        format!(
            "Examples: {{\"id\": {i}, \"tags\": [\"a\", \"bb\"], \"ok\": true}} and \
             {{\"id\": {}, \"tags\": [\"ccc\"], \"ok\": false}}. Another one:",
            i + 1
        )
    };
    let mut out = Vec::new();
    for i in 0..3u32 {
        out.push(Case {
            prompt: quoted(i),
            params: SamplingParams {
                constraint: Some(g.clone()),
                ..SamplingParams::greedy(64)
            },
            constrained: true,
        });
    }
    for i in 0..2u64 {
        out.push(Case {
            prompt: quoted(10 + i as u32),
            params: SamplingParams {
                constraint: Some(g.clone()),
                seed: Some(i),
                temperature: 0.8,
                top_p: 0.95,
                max_tokens: Some(64),
                ..SamplingParams::default()
            },
            constrained: true,
        });
    }
    out.push(Case {
        prompt: "Once upon a time there was a cat. Once upon a time there was a".into(),
        params: SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(48)
        },
        constrained: false,
    });
    out
}

fn request(h: &EngineHandle, c: &Case) -> Request {
    let md = h.model_dir();
    Request {
        tenant: "t".into(),
        cache_scope: "t".into(),
        adapter: None,
        cache_salt: None,
        priority: 0,
        prompt: md.tokenizer.encode(&c.prompt, false).unwrap(),
        params: c.params.clone().validate(md.config.vocab_size).unwrap(),
        arrival: Instant::now(),
        deadline: None,
        first_token_deadline: None,
    }
}

/// Runs `cases` one at a time, then all at once; checks every constrained output; returns the tokens
/// and the speculation counters after the constrained requests ran alone (the first thing it runs).
fn run(h: &EngineHandle, cases: &[Case], name: &str) -> (Vec<Vec<u32>>, Vec<Vec<u32>>, SpecCounters) {
    let submit = |c: &Case| h.submit(request(h, c), TenantLimits::default()).unwrap();
    let check = |c: &Case, (tokens, text, f): (Vec<u32>, String, Finished)| {
        if c.constrained {
            assert_eq!(f.reason, FinishReason::Stop, "{name}: {text:?} ({f:?})");
            check_object_instance(&text);
        } else {
            assert_eq!(f.reason, FinishReason::Length, "{name}: {f:?}");
        }
        tokens
    };
    let mut alone: Vec<Vec<u32>> = Vec::new();
    let mut constrained_only = SpecCounters::default();
    for c in cases {
        if !c.constrained && alone.len() == cases.iter().filter(|c| c.constrained).count() {
            constrained_only = h.stats().spec;
        }
        alone.push(check(c, collect(submit(c))));
    }
    let streams: Vec<RequestStream> = cases.iter().map(submit).collect();
    let batched = cases
        .iter()
        .zip(streams)
        .map(|(c, s)| check(c, collect(s)))
        .collect();
    (alone, batched, constrained_only)
}

#[test]
fn constrained_requests_speculate_exactly_and_stay_valid() {
    let target = generated(7);
    let other = generated(8);
    let md = ModelDir::open(target.path()).unwrap();
    let gs = Grammars::new(
        &md.tokenizer,
        md.config.vocab_size,
        &md.eos_token_ids,
        GrammarLimits::default(),
    )
    .unwrap();
    let g = gs
        .compile(&ConstraintSpec::JsonSchema(
            serde_json::from_str(OBJECT_SCHEMA).unwrap(),
        ))
        .unwrap();
    let cases = cases(&g);
    let greedy = |v: &[Vec<u32>]| -> Vec<Vec<u32>> {
        cases
            .iter()
            .zip(v)
            .filter(|(c, _)| c.params.seed.is_none())
            .map(|(_, t)| t.clone())
            .collect()
    };

    let plain = start(target.path(), None, None);
    assert!(cases.iter().take(5).all(|c| c.constrained) && !cases[5].constrained);
    let (off, off_batched, _) = run(&plain, &cases, "off");
    assert_eq!(off, off_batched, "speculation off: alone vs batched");
    drop(plain);

    let any = |c: &SpecConfig| SpecConfig {
        min_acceptance_rate: 0.0,
        ..*c
    };
    let runs = [
        ("ngram", None, any(&SpecConfig::ngram(4, 1, 3))),
        (
            "draft: same model",
            Some(target.path()),
            any(&SpecConfig::draft_model(3)),
        ),
        (
            "draft: other weights",
            Some(other.path()),
            any(&SpecConfig::draft_model(3)),
        ),
    ];
    for (name, draft, spec) in runs {
        let h = start(target.path(), draft, Some(spec));
        let (alone, batched, spec) = run(&h, &cases, name);
        assert_eq!(greedy(&alone), greedy(&off), "{name}: greedy tokens, alone");
        assert_eq!(greedy(&batched), greedy(&off), "{name}: greedy tokens, batched");
        if draft.is_none() {
            // Point-mass drafts: seeded sampled requests commit exactly what plain sampling draws.
            assert_eq!(alone, off, "{name}: seeded constrained requests, alone");
            assert_eq!(batched, off, "{name}: seeded constrained requests, batched");
        } else {
            assert_eq!(
                alone, batched,
                "{name}: seeded constrained requests, alone vs batched"
            );
        }
        assert!(
            spec.draft_tokens > 0 && spec.accepted_tokens > 0,
            "{name}: the constrained requests did not speculate: {spec:?}"
        );
        eprintln!(
            "{name}: constrained requests alone: {} drafted, {} accepted",
            spec.draft_tokens, spec.accepted_tokens
        );
    }
    assert_eq!(gs.live_states(), 0, "every grammar state was released");
}
