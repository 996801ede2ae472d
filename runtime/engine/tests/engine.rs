//! The engine as the scheduler will drive it: `Engine::load` on a generated model, requests advanced
//! step by step through `Sequence`, and seeded sampling that gives the same tokens for a request whether
//! it runs alone or shares every step with other requests.

use modelfleet_engine::kv::{FreeListPool, KvCacheManager};
use modelfleet_engine::model::{LogitsRows, SeqInput};
use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sequence::Sequence;
use modelfleet_engine::{Engine, EngineConfig, EngineError};
use modelfleet_testkit::gen_model::{GenDType, GenFormat, Shape};

mod common;

struct Request {
    prompt: Vec<u32>,
    seq: Sequence,
    tokens: Vec<u32>,
    computed: usize,
}

/// Runs `requests` to completion in shared steps; returns each one's generated tokens and text.
fn run(engine: &mut Engine, requests: Vec<(Vec<u32>, SamplingParams)>) -> Vec<(Vec<u32>, String)> {
    let vocab = engine.model_dir.config.vocab_size;
    let mut kv = KvCacheManager::new(FreeListPool::new(engine.num_kv_blocks()), engine.block_size());
    let eos = engine.model_dir.eos_token_ids.clone();
    let mut reqs: Vec<Request> = requests
        .into_iter()
        .map(|(prompt, p)| Request {
            seq: Sequence::new(&prompt, p.validate(vocab).unwrap(), &eos, engine.max_model_len()),
            tokens: prompt.clone(),
            prompt,
            computed: 0,
        })
        .collect();
    let mut texts = vec![String::new(); reqs.len()];
    loop {
        let live: Vec<usize> = (0..reqs.len())
            .filter(|&i| reqs[i].seq.finished().is_none())
            .collect();
        if live.is_empty() {
            break;
        }
        let tables: Vec<Vec<Vec<u32>>> = live
            .iter()
            .map(|&i| {
                let r = &reqs[i];
                kv.allocate_slots(i as u64, r.computed, r.tokens.len() - r.computed)
                    .unwrap()
                    .to_vec()
            })
            .collect();
        let batch: Vec<SeqInput<'_>> = live
            .iter()
            .zip(&tables)
            .map(|(&i, t)| SeqInput {
                tokens: &reqs[i].tokens[reqs[i].computed..],
                start_pos: reqs[i].computed,
                block_tables: t,
                logits: LogitsRows::Last,
                adapter: None,
            })
            .collect();
        let logits = engine.step(&batch).unwrap();
        for (j, &i) in live.iter().enumerate() {
            let r = &mut reqs[i];
            r.computed = r.tokens.len();
            let e = r
                .seq
                .step(&engine.model_dir.tokenizer, logits.last(j).unwrap())
                .unwrap();
            texts[i].push_str(&e.text);
            r.tokens.push(e.token);
            if e.finish.is_some() {
                kv.free(i as u64);
            }
        }
    }
    reqs.into_iter()
        .zip(texts)
        .map(|(r, t)| (r.tokens[r.prompt.len()..].to_vec(), t))
        .collect()
}

#[test]
fn seeded_requests_generate_the_same_alone_or_batched() {
    let dir = common::generated(Shape::TinyQwen2, 2, GenDType::F32, GenFormat::Safetensors);
    let mut engine = Engine::load(
        dir.path(),
        &EngineConfig {
            num_kv_blocks: Some(64),
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let tok = &engine.model_dir.tokenizer;
    let prompts: Vec<Vec<u32>> = [
        "Once upon a time",
        "The server answers",
        "Hello, world! How are you",
    ]
    .iter()
    .map(|t| tok.encode(t, false).unwrap())
    .collect();
    let params = |seed: u64| SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 50,
        seed: Some(seed),
        max_tokens: Some(24),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let together = run(
        &mut engine,
        prompts
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), params(i as u64)))
            .collect(),
    );
    for (i, p) in prompts.iter().enumerate() {
        let alone = run(&mut engine, vec![(p.clone(), params(i as u64))]);
        assert_eq!(alone[0], together[i], "request {i}");
        assert_eq!(together[i].0.len(), 24);
        let decoded = engine.model_dir.tokenizer.decode(&together[i].0, true).unwrap();
        assert_eq!(together[i].1, decoded, "streamed text equals the decoded tokens");
    }
    assert_ne!(together[0].0, together[1].0);
}

#[test]
fn limits_are_checked_at_load_and_per_step() {
    let dir = common::generated(Shape::Tiny, 2, GenDType::F16, GenFormat::Gguf);
    let too_long = EngineConfig {
        max_model_len: Some(4096),
        ..EngineConfig::default()
    };
    match Engine::load(dir.path(), &too_long) {
        Err(EngineError::InvalidParam { field, message }) => {
            assert_eq!(field, "max_model_len");
            assert!(message.contains("[1, 2048]"), "{message}");
        }
        other => panic!("expected max_model_len to be refused, got {:?}", other.err()),
    }
    let cfg = EngineConfig {
        max_model_len: Some(8),
        block_size: 4,
        max_num_seqs: 2,
        ..EngineConfig::default()
    };
    let mut engine = Engine::load(dir.path(), &cfg).unwrap();
    assert_eq!((engine.num_kv_blocks(), engine.block_size()), (4, 4));
    let seq = SeqInput {
        tokens: &[1; 9],
        start_pos: 0,
        block_tables: &[vec![0, 1, 2]],
        logits: LogitsRows::Last,
        adapter: None,
    };
    assert!(matches!(engine.step(&[seq]), Err(EngineError::Batch(m)) if m.contains("max_model_len (8)")));
}
