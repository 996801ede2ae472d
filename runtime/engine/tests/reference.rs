//! The engine against an independent implementation: `candle-transformers`' Llama, Mistral, Qwen2,
//! Qwen3, Gemma 3 and Phi-3 models (written by Hugging Face, not here) on each architecture's `gen-model`
//! output in safetensors — the Hugging Face layout, where Gemma stores its norms as offsets from 1.
//!
//! candle's Gemma 3 lets a local layer see one key more than `transformers` and llama.cpp do (its mask
//! keeps `i − j ≤ window`), so the Gemma comparison widens the window past the sequence; the window
//! itself is checked against llama.cpp (llamacpp_families.rs).
//!
//! candle's Phi-3 LongRoPE multiplies the per-pair factors into the frequencies where `transformers`
//! divides by them, and leaves out the attention factor, so the Phi-3 comparison runs without
//! `rope_scaling` (fused projections and partial rotary dimensions are what it checks); LongRoPE is
//! checked against llama.cpp.
//!
//! For each tiny shape: the engine prefills a chat prompt and greedily generates 64 tokens; candle then
//! runs the same token sequence one position at a time. At every position the logits must agree within
//! 2e-2 and have the same top-1 token — which, by induction over positions, means candle's own greedy
//! continuation is the same 64 tokens. The engine's generation also goes through `Sequence` (sampling
//! params, processors, stop checks) to show the serving path picks the same tokens.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::{gemma3, llama, mistral, phi3, qwen2, qwen3};
use modelfleet_engine::ModelDir;
use modelfleet_engine::kernels::cpu::{Bf16Dot, CpuKernels};
use modelfleet_engine::kv::{FreeListPool, KvCacheManager};
use modelfleet_engine::model::{Decoder, LogitsRows, SeqInput};
use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sequence::Sequence;
use modelfleet_engine::tokenizer::ChatMessage;
use modelfleet_testkit::gen_model::{GenDType, GenFormat, Shape};
use std::path::Path;

mod common;

const GENERATE: usize = 64;
const TOLERANCE: f32 = 2e-2;

/// A candle model that returns the logits of the one token it is given.
enum Reference {
    Llama(llama::Llama, llama::Cache),
    Mistral(mistral::Model),
    Qwen2(qwen2::ModelForCausalLM),
    Qwen3(qwen3::ModelForCausalLM),
    Gemma3(gemma3::Model),
    Phi3(phi3::Model),
}

impl Reference {
    fn load(dir: &Path, shape: Shape) -> Reference {
        let dev = Device::Cpu;
        let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
        // SAFETY: the file was just written by this test and is not modified while mapped.
        let vb = unsafe {
            VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &dev)
        }
        .unwrap();
        match shape {
            Shape::TinyMistral => {
                let cfg: mistral::Config = serde_json::from_str(&config).unwrap();
                Reference::Mistral(mistral::Model::new(&cfg, vb).unwrap())
            }
            Shape::TinyQwen2 => {
                let cfg: qwen2::Config = serde_json::from_str(&config).unwrap();
                Reference::Qwen2(qwen2::ModelForCausalLM::new(&cfg, vb).unwrap())
            }
            Shape::TinyQwen3 => {
                let cfg: qwen3::Config = serde_json::from_str(&config).unwrap();
                Reference::Qwen3(qwen3::ModelForCausalLM::new(&cfg, vb).unwrap())
            }
            Shape::TinyGemma3 => {
                let cfg: gemma3::Config = serde_json::from_str(&config).unwrap();
                Reference::Gemma3(gemma3::Model::new(false, &cfg, vb).unwrap())
            }
            Shape::TinyPhi3 => {
                let cfg: phi3::Config = serde_json::from_str(&config).unwrap();
                Reference::Phi3(phi3::Model::new(&cfg, vb).unwrap())
            }
            _ => {
                let cfg: llama::LlamaConfig = serde_json::from_str(&config).unwrap();
                let cfg = cfg.into_config(false);
                let cache = llama::Cache::new(true, DType::F32, &cfg, &dev).unwrap();
                Reference::Llama(llama::Llama::load(vb, &cfg).unwrap(), cache)
            }
        }
    }

    fn step(&mut self, token: u32, pos: usize) -> Vec<f32> {
        let input = Tensor::new(&[token], &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        let out = match self {
            Reference::Llama(m, cache) => m.forward(&input, pos, cache).unwrap(),
            Reference::Mistral(m) => m.forward(&input, pos).unwrap(),
            Reference::Qwen2(m) => m.forward(&input, pos).unwrap(),
            Reference::Qwen3(m) => m.forward(&input, pos).unwrap(),
            Reference::Gemma3(m) => m.forward(&input, pos).unwrap(),
            Reference::Phi3(m) => m.forward(&input, pos).unwrap(),
        };
        out.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn check_shape(shape: Shape, dtype: GenDType) {
    let dir = common::generated(shape, 7, dtype, GenFormat::Safetensors);
    if shape == Shape::TinyGemma3 {
        // The window past the sequence (see the header), and the pattern under the key candle reads.
        let path = dir.path().join("config.json");
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        config["sliding_window"] = 4096.into();
        config["sliding_window_pattern"] = 6.into();
        std::fs::write(&path, config.to_string()).unwrap();
    }
    if shape == Shape::TinyPhi3 {
        // Without LongRoPE (see the header); candle reads one EOS id.
        let path = dir.path().join("config.json");
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        config["rope_scaling"] = serde_json::Value::Null;
        if let Some(first) = config["eos_token_id"].as_array().and_then(|a| a.first()).cloned() {
            config["eos_token_id"] = first;
        }
        std::fs::write(&path, config.to_string()).unwrap();
    }
    let md = ModelDir::open(dir.path()).unwrap();
    let template = md.chat_template.as_ref().unwrap();
    let text = template
        .render(
            &[ChatMessage::new(
                "user",
                "What is the weather like in the city today?",
            )],
            true,
        )
        .unwrap();
    let prompt = md.tokenizer.encode(&text, false).unwrap();
    assert!(prompt.len() > 10, "{shape:?}: prompt of {} tokens", prompt.len());

    // Engine: prefill with all logits, then greedy decode.
    // The exact f32 products: the bf16 dot products' cost is measured by bench/accuracy.sh and
    // bounded in forward.rs.
    let kernels = CpuKernels::new(0).with_bf16_dot(Bf16Dot::Off);
    let model = Decoder::load(&kernels, md.config.clone(), &md.weights).unwrap();
    let vocab = md.config.vocab_size;
    let blocks = 32 * model.kv_groups().len();
    let mut kv = KvCacheManager::with_groups(FreeListPool::new(blocks), 16, model.kv_groups());
    let mut cache = model.new_kv_cache(&kernels, blocks, 16);
    let table = kv.allocate_slots(1, 0, prompt.len()).unwrap().to_vec();
    let seq = SeqInput {
        tokens: &prompt,
        start_pos: 0,
        block_tables: &table,
        logits: LogitsRows::All,
        adapter: None,
    };
    let out = model.forward(&kernels, &[seq], &mut cache).unwrap();
    let mut engine_logits: Vec<Vec<f32>> = out.seq(0).chunks(vocab).map(<[f32]>::to_vec).collect();
    let mut tokens = prompt.clone();
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(GENERATE)
    }
    .validate(vocab)
    .unwrap();
    let mut sequence = Sequence::new(
        &prompt,
        params,
        &md.eos_token_ids,
        md.config.max_position_embeddings,
    );
    for i in 0..GENERATE {
        let last = engine_logits.last().unwrap();
        let next = argmax(last);
        let event = sequence.step(&md.tokenizer, last).unwrap();
        assert_eq!(event.token, next, "{shape:?}: Sequence's greedy pick at step {i}");
        tokens.push(next);
        if i + 1 == GENERATE {
            assert_eq!(event.finish.map(|f| f.as_str()), Some("length"));
            break;
        }
        let pos = tokens.len() - 1;
        let table = kv.allocate_slots(1, pos, 1).unwrap().to_vec();
        let seq = SeqInput {
            tokens: &tokens[pos..],
            start_pos: pos,
            block_tables: &table,
            logits: LogitsRows::Last,
            adapter: None,
        };
        engine_logits.push(
            model
                .forward(&kernels, &[seq], &mut cache)
                .unwrap()
                .last(0)
                .unwrap()
                .to_vec(),
        );
    }
    let distinct: std::collections::HashSet<_> = tokens[prompt.len()..].iter().collect();
    assert!(
        distinct.len() > 4,
        "{shape:?}: degenerate continuation {:?}",
        &tokens[prompt.len()..]
    );

    // Reference: the same sequence, one position at a time.
    let mut reference = Reference::load(dir.path(), shape);
    let mut worst = 0.0f32;
    for (pos, engine) in engine_logits.iter().enumerate() {
        let theirs = reference.step(tokens[pos], pos);
        assert_eq!(theirs.len(), vocab);
        let delta = engine
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        worst = worst.max(delta);
        assert!(
            delta <= TOLERANCE,
            "{shape:?} position {pos}: max |Δlogit| {delta}"
        );
        assert_eq!(
            argmax(engine),
            argmax(&theirs),
            "{shape:?} position {pos}: top-1 differs"
        );
    }
    eprintln!(
        "{shape:?} {dtype:?}: {} positions, max |Δlogit| {worst:e}",
        engine_logits.len()
    );
}

#[test]
fn tiny_llama_matches_candle() {
    check_shape(Shape::Tiny, GenDType::F32);
}

#[test]
fn tiny_llama3_rope_scaling_matches_candle() {
    check_shape(Shape::TinyLlama3, GenDType::F32);
}

#[test]
fn tiny_mistral_matches_candle() {
    check_shape(Shape::TinyMistral, GenDType::F32);
}

#[test]
fn tiny_qwen2_with_bias_matches_candle() {
    check_shape(Shape::TinyQwen2, GenDType::F32);
}

#[test]
fn tiny_qwen3_with_qk_norms_matches_candle() {
    check_shape(Shape::TinyQwen3, GenDType::F32);
}

#[test]
fn tiny_gemma3_with_sandwich_norms_and_geglu_matches_candle() {
    check_shape(Shape::TinyGemma3, GenDType::F32);
}

#[test]
fn tiny_phi3_with_fused_projections_and_partial_rotary_matches_candle() {
    check_shape(Shape::TinyPhi3, GenDType::F32);
}

#[test]
fn f16_and_bf16_weights_match_candle() {
    check_shape(Shape::Tiny, GenDType::F16);
    check_shape(Shape::TinyQwen2, GenDType::Bf16);
}
