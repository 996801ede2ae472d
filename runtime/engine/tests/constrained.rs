//! Structured output through the real step loop on a generated tiny model (random weights, so the
//! grammar alone makes the output valid):
//!
//! - constrained greedy outputs are valid JSON, the same alone or batched, and the same when a tiny KV
//!   pool forces preemption (the grammar state survives recompute), and the same when the prompt comes
//!   from the prefix cache;
//! - a seed reproduces a constrained sample alone or batched; `n`-style copies each get their own state;
//! - constraints compose with `stop`, `logit_bias`, `min_tokens` and penalties;
//! - a constraint that cannot complete within `max_tokens` ends with `length`;
//! - cancelled requests free their grammar state.

use modelfleet_engine::constraint::{ConstraintSpec, GrammarLimits, Grammars};
use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sched::{
    EngineHandle, QueueLimits, Request, RequestEvent, RequestStream, SchedulerConfig, TenantLimits,
};
use modelfleet_engine::stop::FinishReason;
use modelfleet_engine::{Engine, EngineConfig, ModelDir};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::collect;

use common::tiny_model;
use modelfleet_testkit::fixtures::{OBJECT_SCHEMA, check_object_instance};

fn start(dir: &Path, num_kv_blocks: usize, max_num_seqs: usize) -> EngineHandle {
    let path = dir.to_path_buf();
    EngineHandle::start(
        move || {
            Engine::load(
                &path,
                &EngineConfig {
                    threads: 1,
                    block_size: 4,
                    num_kv_blocks: Some(num_kv_blocks),
                    max_model_len: Some(256),
                    ..EngineConfig::default()
                },
            )
        },
        SchedulerConfig {
            max_num_seqs,
            ..SchedulerConfig::default()
        },
        QueueLimits {
            max_queued_requests: 1000,
            max_queued_tokens: 1_000_000,
        },
    )
    .unwrap()
}

fn grammars(dir: &Path) -> Grammars {
    let md = ModelDir::open(dir).unwrap();
    Grammars::new(
        &md.tokenizer,
        md.config.vocab_size,
        &md.eos_token_ids,
        GrammarLimits::default(),
    )
    .unwrap()
}

fn request(h: &EngineHandle, prompt: Vec<u32>, p: SamplingParams) -> Request {
    Request {
        tenant: "t".into(),
        cache_scope: "t".into(),
        adapter: None,
        cache_salt: None,
        priority: 0,
        prompt,
        params: p.validate(h.model_dir().config.vocab_size).unwrap(),
        arrival: Instant::now(),
        deadline: None,
        first_token_deadline: None,
    }
}

fn prompt(salt: u32) -> Vec<u32> {
    (0..12u32)
        .map(|i| 20 + (i * 7 + salt * 31 + i * i * 3) % 400)
        .collect()
}

fn submit(h: &EngineHandle, r: Request) -> RequestStream {
    h.submit(r, TenantLimits::default()).unwrap()
}

#[test]
fn constrained_outputs_are_valid_alone_batched_and_preempted() {
    let dir = tiny_model();
    let gs = grammars(dir.path());
    let g = gs
        .compile(&ConstraintSpec::JsonSchema(
            serde_json::from_str(OBJECT_SCHEMA).unwrap(),
        ))
        .unwrap();
    let greedy = |_: u32| SamplingParams {
        constraint: Some(g.clone()),
        ..SamplingParams::greedy(60)
    };
    let seeded = |seed: u64| SamplingParams {
        constraint: Some(g.clone()),
        seed: Some(seed),
        temperature: 1.0,
        max_tokens: Some(60),
        ..SamplingParams::default()
    };
    let roomy = start(dir.path(), 1024, 16);
    let alone: Vec<_> = (0..6)
        .map(|i| {
            let (tokens, text, f) = collect(submit(
                &roomy,
                request(
                    &roomy,
                    prompt(i),
                    if i < 3 { greedy(i) } else { seeded(i as u64) },
                ),
            ));
            assert_eq!(f.reason, FinishReason::Stop, "{text}");
            check_object_instance(&text);
            tokens
        })
        .collect();
    let streams: Vec<_> = (0..6)
        .map(|i| {
            submit(
                &roomy,
                request(
                    &roomy,
                    prompt(i),
                    if i < 3 { greedy(i) } else { seeded(i as u64) },
                ),
            )
        })
        .collect();
    let mut cached = 0;
    let batched: Vec<_> = streams
        .into_iter()
        .map(|s| {
            let (tokens, _, f) = collect(s);
            cached += f.usage.cached_tokens;
            tokens
        })
        .collect();
    assert_eq!(alone, batched, "the same alone or batched (greedy and seeded)");
    assert!(
        cached > 0,
        "the repeated prompts came from the prefix cache, and the outputs are the same"
    );
    drop(roomy);
    // 24 blocks of 4 tokens hold one request (12 + 60 tokens) but not six (~57 tokens each):
    // preemption is certain.
    let tight = start(dir.path(), 24, 16);
    let streams: Vec<_> = (0..6)
        .map(|i| {
            submit(
                &tight,
                request(
                    &tight,
                    prompt(i),
                    if i < 3 { greedy(i) } else { seeded(i as u64) },
                ),
            )
        })
        .collect();
    let mut preemptions = 0;
    let preempted: Vec<_> = streams
        .into_iter()
        .map(|s| {
            let (tokens, text, f) = collect(s);
            assert_eq!(f.reason, FinishReason::Stop, "{text} {:?}", f.message);
            check_object_instance(&text);
            preemptions += f.timings.preemptions;
            tokens
        })
        .collect();
    assert!(preemptions > 0, "the tight pool preempted nothing");
    assert_eq!(
        alone, preempted,
        "recompute after preemption resumes the grammar where it was"
    );
    assert_eq!(gs.live_states(), 0, "finished requests freed their states");
}

#[test]
fn constraints_compose_and_cut_short_is_length() {
    let dir = tiny_model();
    let gs = grammars(dir.path());
    let h = start(dir.path(), 1024, 8);
    let md = ModelDir::open(dir.path()).unwrap();
    let g = gs
        .compile(&ConstraintSpec::JsonSchema(
            serde_json::from_str(OBJECT_SCHEMA).unwrap(),
        ))
        .unwrap();
    // max_tokens too small for any instance: `length`, and what came is a prefix of valid JSON.
    let (_, text, f) = collect(submit(
        &h,
        request(
            &h,
            prompt(1),
            SamplingParams {
                constraint: Some(g.clone()),
                ..SamplingParams::greedy(4)
            },
        ),
    ));
    assert_eq!(f.reason, FinishReason::Length);
    assert!(text.starts_with("{\"id"), "{text}");
    // A stop string inside the grammar's output cuts it there (the caller's choice).
    let (_, text, f) = collect(submit(
        &h,
        request(
            &h,
            prompt(1),
            SamplingParams {
                constraint: Some(g.clone()),
                stop: vec!["\"tags\"".into()],
                ..SamplingParams::greedy(120)
            },
        ),
    ));
    assert_eq!(
        (f.reason, text.ends_with(',')),
        (FinishReason::Stop, true),
        "{text}"
    );
    // logit_bias and penalties change which valid instance comes, never validity; min_tokens longer
    // than the grammar allows gives way to the grammar.
    let comma = md.tokenizer.encode(",", false).unwrap()[0];
    for p in [
        SamplingParams {
            logit_bias: vec![(comma, -100.0)],
            ..SamplingParams::greedy(120)
        },
        SamplingParams {
            repetition_penalty: 1.5,
            presence_penalty: 1.0,
            frequency_penalty: 1.0,
            ..SamplingParams::greedy(120)
        },
        SamplingParams {
            min_tokens: 100,
            ..SamplingParams::greedy(120)
        },
    ] {
        let p = SamplingParams {
            constraint: Some(g.clone()),
            ..p
        };
        let (_, text, f) = collect(submit(&h, request(&h, prompt(2), p)));
        assert_eq!(f.reason, FinishReason::Stop, "{text}");
        check_object_instance(&text);
    }
    // Choice and regex through the loop.
    let choice = gs
        .compile(&ConstraintSpec::Choice(vec![
            "yes".into(),
            "no".into(),
            "maybe not".into(),
        ]))
        .unwrap();
    let rx = gs
        .compile(&ConstraintSpec::Regex("[0-9]{3}-[a-z]{2,4}".into()))
        .unwrap();
    for seed in 0..8 {
        let sample = |c: &Arc<_>| SamplingParams {
            constraint: Some(Arc::clone(c)),
            seed: Some(seed),
            max_tokens: Some(30),
            ..SamplingParams::default()
        };
        let (_, text, _) = collect(submit(&h, request(&h, prompt(seed as u32), sample(&choice))));
        assert!(["yes", "no", "maybe not"].contains(&text.as_str()), "{text}");
        let (_, text, _) = collect(submit(&h, request(&h, prompt(seed as u32), sample(&rx))));
        let (digits, letters) = text.split_once('-').unwrap();
        assert!(
            digits.len() == 3 && digits.chars().all(|c| c.is_ascii_digit()),
            "{text}"
        );
        assert!(
            (2..=4).contains(&letters.len()) && letters.chars().all(|c| c.is_ascii_lowercase()),
            "{text}"
        );
    }
    assert_eq!(gs.live_states(), 0);
}

#[test]
fn cancelled_requests_free_their_grammar_state() {
    let dir = tiny_model();
    let gs = grammars(dir.path());
    let h = start(dir.path(), 1024, 8);
    // Letters until a `!` that the bias keeps away: these requests do not end by themselves.
    let g = gs.compile(&ConstraintSpec::Regex("[a-z]*!".into())).unwrap();
    let bang = ModelDir::open(dir.path())
        .unwrap()
        .tokenizer
        .encode("!", false)
        .unwrap()[0];
    let p = SamplingParams {
        constraint: Some(g.clone()),
        logit_bias: vec![(bang, -100.0)],
        ..SamplingParams::greedy(200)
    };
    let mut streams: Vec<_> = (0..4)
        .map(|i| submit(&h, request(&h, prompt(i), p.clone())))
        .collect();
    for s in &mut streams {
        assert!(matches!(s.blocking_next(), Some(RequestEvent::Token(_))));
    }
    assert_eq!(gs.live_states(), 4);
    drop(streams);
    let t = Instant::now();
    while gs.live_states() > 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(gs.live_states(), 0, "dropped streams freed their grammar states");
}

#[test]
fn constrained_requests_with_a_lora_adapter_are_valid_and_batch_with_the_base() {
    use modelfleet_engine::lora::{AdapterIdentity, LoraAdapter};
    let dir = tiny_model();
    let adir = tempfile::tempdir().unwrap();
    modelfleet_testkit::gen_adapter::gen_adapter(adir.path(), dir.path(), 8, 3, &[]).unwrap();
    let cfg = ModelDir::open(dir.path()).unwrap().config;
    let identity = AdapterIdentity {
        name: "a".into(),
        digest: "sha256:test".into(),
    };
    let adapter = Arc::new(LoraAdapter::load(adir.path(), &cfg, 64, identity).unwrap());
    let gs = grammars(dir.path());
    let g = gs
        .compile(&ConstraintSpec::JsonSchema(
            serde_json::from_str(OBJECT_SCHEMA).unwrap(),
        ))
        .unwrap();
    let h = start(dir.path(), 1024, 8);
    let with = |a: Option<Arc<LoraAdapter>>, i: u32| {
        let mut r = request(
            &h,
            prompt(i),
            SamplingParams {
                constraint: Some(g.clone()),
                ..SamplingParams::greedy(60)
            },
        );
        r.adapter = a;
        r
    };
    let alone: Vec<_> = (0..4)
        .map(|i| collect(submit(&h, with((i % 2 == 1).then(|| adapter.clone()), i))))
        .collect();
    // Base and adapter requests in one batch: each as it was alone, each valid.
    let streams: Vec<_> = (0..4)
        .map(|i| submit(&h, with((i % 2 == 1).then(|| adapter.clone()), i)))
        .collect();
    for ((tokens, text, f), (alone_tokens, _, _)) in streams.into_iter().map(collect).zip(&alone) {
        assert_eq!(f.reason, FinishReason::Stop, "{text} {:?}", f.message);
        check_object_instance(&text);
        assert_eq!(
            &tokens, alone_tokens,
            "the same alone or batched with the other adapter"
        );
    }
    drop(h);
    assert_eq!(gs.live_states(), 0);
}
