//! The model families against llama.cpp itself: logits llama.cpp computed on generated tiny models of
//! each family (f16, q8_0 and Q4_K GGUF, `gen-model --seed 7`, regenerated here) and on the real
//! Gemma 3 270M (Q4_K_M, from PyPI), stored in `tests/data/llamacpp_families.bin` by
//! `bench/llamacpp/reference.py --families`; and the real Gemma 3 270M's perplexity on
//! `tests/data/perplexity_text.txt` against `llama-perplexity`'s
//! (`tests/data/gemma3_270m_perplexity.json`, `reference.py --perplexity`).
//!
//! Each case: the engine prefills prompt + llama.cpp's 64-token greedy continuation in one step and is
//! compared with llama.cpp's top-64 at every position (common/llamacpp.rs). Every case prints its
//! max |Δlogit| and top-1 agreement (`cargo test --test llamacpp_families -- --nocapture`).
//!
//! The generated Gemma has a 16-token window, so its 106 positions run the local layers' window and
//! both RoPE bases; Qwen3's head_dim (128) differs from hidden/heads (64).

use modelfleet_engine::ModelDir;
use modelfleet_engine::model::Architecture;
use modelfleet_testkit::fixtures::gemma3_270m_gguf;
use modelfleet_testkit::gen_model::{GenDType, GenFormat, Shape};

mod common;
use common::llamacpp::{Bar, Case, argmax, check, engine_logits};

const DATA: &[u8] = include_bytes!("data/llamacpp_families.bin");

fn case(name: &str) -> Case {
    common::llamacpp::case(DATA, name)
}

/// llama.cpp's F16 path rounds each product's activations to f16 while the engine keeps f32 (the
/// SmolLM2 f16 case: up to 3.7e-2 from that alone).
/// llama.cpp's exact-f32 path, the llama reference test's tolerance (measured 2026-12-06: at most
/// 1.25e-2 over the four prompts).
const F32: Bar = Bar {
    tolerance: Some(2e-2),
    min_top1: 1.0,
    their_tie: 0.0,
    our_tie: 0.0,
};

const F16: Bar = Bar {
    tolerance: Some(5e-2),
    min_top1: 1.0,
    their_tie: 0.0,
    our_tie: 0.0,
};

/// Quantized weights, as for SmolLM2 (llamacpp_reference.rs): both sides quantize activations to 8
/// bits per block, so near ties may flip, and every flip must be a near tie in both.
const QUANT: Bar = Bar {
    tolerance: None,
    min_top1: 0.95,
    their_tie: 0.3,
    our_tie: 0.6,
};

/// The generated models' logits are flat (random weights: the top few of 512 tokens within ~0.1 at
/// most positions), so 8-bit noise flips more of them than on a trained model: on Q4_K 93–94 % agree
/// (2026-12-06), every flip within 0.11 in llama.cpp's logits and 0.08 in ours. The bar keeps 90 % and
/// a tie bound half as wide as the real models'.
const QUANT_FLAT: Bar = Bar {
    tolerance: None,
    min_top1: 0.9,
    their_tie: 0.15,
    our_tie: 0.15,
};

/// A mixture of experts in f16: the routing sees the same 8-bit-free logits as llama.cpp's, but the
/// generated model's near ties (random weights) are as close as the f16 rounding of the activations
/// llama.cpp does and the engine does not: one flip in 106 positions, 2.3e-3 apart in llama.cpp's
/// logits (2026-12-06), is allowed; the |Δlogit| bound is the dense families'.
const F16_MOE: Bar = Bar {
    tolerance: Some(5e-2),
    min_top1: 0.98,
    their_tie: 1e-2,
    our_tie: 1e-2,
};

/// A mixture of experts in Q4_K: where two experts' router scores are close, the two sides' 8-bit
/// activation rounding of the layers before may route a row differently, a discrete change the dense
/// families do not have, so our side of a flip is allowed to be wider (measured 2026-12-06: flips
/// at most 0.11 apart in llama.cpp's logits, up to 0.38 in ours); llama.cpp's side keeps the dense
/// families' bound. q8_0, with half the noise, agrees at every position.
const QUANT_MOE: Bar = Bar {
    tolerance: None,
    min_top1: 0.9,
    their_tie: 0.15,
    our_tie: 0.5,
};

fn family(shape: Shape, arch: Architecture, prefix: &str) {
    family_with(shape, arch, prefix, [F16, QUANT_FLAT]);
}

fn family_with(shape: Shape, arch: Architecture, prefix: &str, [f16, q4k]: [Bar; 2]) {
    for (dtype, suffix, bar) in [
        (GenDType::F16, "f16", f16),
        (GenDType::Q8_0, "q8_0", QUANT_FLAT),
        (GenDType::Q4K, "q4_k", q4k),
    ] {
        let dir = common::generated(shape, 7, dtype, GenFormat::Gguf);
        let md = ModelDir::open(dir.path()).unwrap();
        assert_eq!(md.config.architecture, arch);
        let c = case(&format!("{prefix}-{suffix}"));
        // The generator's tokenizer still gives llama.cpp's prompt ids (tokens added since, such as
        // Qwen3's `<think>`, took ids no prompt token uses).
        assert_eq!(
            md.tokenizer.encode(&c.prompt_text, true).unwrap(),
            c.prompt,
            "{}",
            c.name
        );
        check(&md, &c, bar);
    }
}

#[test]
fn qwen3_matches_llama_cpp_in_f16_q8_0_and_q4_k() {
    family(Shape::TinyQwen3, Architecture::Qwen3, "qwen3");
}

#[test]
fn gemma3_matches_llama_cpp_in_f16_q8_0_and_q4_k() {
    family(Shape::TinyGemma3, Architecture::Gemma3, "gemma3");
}

/// Qwen3-MoE (8 experts, top-2, every layer): the router, the renormalised top-k and the experts
/// stacked in GGUF (`ffn_*_exps`), in every format.
#[test]
fn qwen3moe_matches_llama_cpp_in_f16_q8_0_and_q4_k() {
    family_with(
        Shape::TinyQwen3Moe,
        Architecture::Qwen3Moe,
        "qwen3moe",
        [F16_MOE, QUANT_MOE],
    );
}

/// Phi-3 (Phi-4-mini's shape in small: fused `attn_qkv` and gate/up `ffn_up`, RoPE on 48 of 64
/// elements per head, LongRoPE's short factors and attention factor at llama.cpp's 512-token context).
#[test]
fn phi3_matches_llama_cpp_in_f16_q8_0_and_q4_k() {
    family(Shape::TinyPhi3, Architecture::Phi3, "phi3");
}

/// The same Phi-3 in safetensors (`qkv_proj`, `gate_up_proj`, LongRoPE in `config.json`) gives the GGUF
/// file's logits (both f32): the fused rows split alike, and the factors read from `config.json` equal
/// those read from the GGUF file's `rope_factors_*` tensors.
#[test]
fn phi3_safetensors_and_gguf_agree() {
    let (st, gg) = both_layouts(Shape::TinyPhi3);
    assert_eq!(st.config.long_rope, gg.config.long_rope);
    assert_eq!((st.config.rotary_dim, gg.config.rotary_dim), (48, 48));
    same_logits(&st, &gg, "phi3");
}

/// The same Qwen3-MoE in safetensors (one tensor per expert, `mlp.experts.E.*_proj`) gives the GGUF
/// file's logits (both f32, the same values): the two layouts load the same experts.
#[test]
fn qwen3moe_safetensors_and_gguf_load_the_same_experts() {
    let (st, gg) = both_layouts(Shape::TinyQwen3Moe);
    same_logits(&st, &gg, "qwen3moe");
}

/// The generated `shape` (seed 7, f32) opened from safetensors and from GGUF.
fn both_layouts(shape: Shape) -> (ModelDir, ModelDir) {
    let st = common::generated(shape, 7, GenDType::F32, GenFormat::Safetensors);
    let gg = common::generated(shape, 7, GenDType::F32, GenFormat::Gguf);
    (
        ModelDir::open(st.path()).unwrap(),
        ModelDir::open(gg.path()).unwrap(),
    )
}

/// Both give the same logits (within 1e-4) on the `{prefix}-f16` case's prompt and continuation.
fn same_logits(st: &ModelDir, gg: &ModelDir, prefix: &str) {
    let c = case(&format!("{prefix}-f16"));
    let tokens: Vec<u32> = c.prompt.iter().chain(&c.continuation).copied().collect();
    let (a, b) = (engine_logits(st, &tokens), engine_logits(gg, &tokens));
    let max = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    eprintln!("{prefix} safetensors vs GGUF f32: max |Δlogit| {max:.2e}");
    assert!(max < 1e-4, "{max}");
}

/// The real Gemma 3 270M as shipped (Q4_K_M: Q8_0, Q5_0, Q4_K, Q6_K tensors): the engine's tokenizer
/// gives llama.cpp's prompt ids (BOS first), and at every position of every prompt's continuation the
/// top-1 is llama.cpp's or a near tie in both (SmolLM2's rule). Free-running greedy continuations
/// part at the first such tie (measured 2026-12-06: 15, 64, 2 and 58 of 64 tokens equal; printed), so
/// equality of whole continuations is asserted on the exact f32 path below.
#[test]
fn real_gemma3_270m_q4_k_m_agrees_with_llama_cpp_at_every_position() {
    let md = ModelDir::open(&gemma3_270m_gguf()).unwrap();
    assert_eq!(md.config.architecture, Architecture::Gemma3);
    for p in 0..4 {
        let c = case(&format!("gemma3-270m-p{p}"));
        assert_eq!(
            md.tokenizer.encode(&c.prompt_text, true).unwrap(),
            c.prompt,
            "{}: the engine's tokenizer gives llama.cpp's prompt ids",
            c.name
        );
        let m = check(&md, &c, QUANT);
        let tokens: Vec<u32> = c.prompt.iter().chain(&c.continuation).copied().collect();
        let ours = engine_logits(&md, &tokens);
        let n = c.prompt.len();
        let greedy: Vec<u32> = (0..c.continuation.len())
            .map(|i| argmax(&ours[n - 1 + i]))
            .collect();
        let same = greedy
            .iter()
            .zip(&c.continuation)
            .take_while(|(a, b)| a == b)
            .count();
        eprintln!(
            "{}: the first {same} of {} greedy tokens equal (top-1 agreement {:.3}, max |Δlogit| {:.2})",
            c.name,
            greedy.len(),
            m.top1,
            m.max_delta
        );
    }
}

/// The real Gemma 3 270M with every tensor dequantized to f32 (candle's GGML dequantizer here, the
/// `gguf` package in the script — both exact), where llama.cpp computes in f32: the engine's greedy
/// continuation of every prompt is llama.cpp's, all 64 tokens.
#[test]
fn real_gemma3_270m_in_f32_continues_every_prompt_as_llama_cpp_does() {
    let dir = common::requantized(&gemma3_270m_gguf(), candle_core::quantized::GgmlDType::F32);
    let md = ModelDir::open(&dir.path().join("model.gguf")).unwrap();
    for p in 0..4 {
        let c = case(&format!("gemma3-270m-f32-p{p}"));
        check(&md, &c, F32);
    }
}

/// Perplexity as `llama-perplexity -c 512` computes it: the text tokenized with BOS, cut into 512-token
/// chunks (the remainder dropped), each chunk's first token replaced by BOS and evaluated alone, and
/// the next-token log-likelihoods from position 256 on averaged over every chunk.
#[test]
fn real_gemma3_270m_perplexity_is_within_half_a_percent_of_llama_cpp() {
    let reference: serde_json::Value =
        serde_json::from_str(include_str!("data/gemma3_270m_perplexity.json")).unwrap();
    let text = include_str!("data/perplexity_text.txt");
    let md = ModelDir::open(&gemma3_270m_gguf()).unwrap();
    let n_ctx = reference["n_ctx"].as_u64().unwrap() as usize;
    let tokens = md.tokenizer.encode(text, true).unwrap();
    let chunks = tokens.len() / n_ctx;
    assert_eq!(
        chunks as u64,
        reference["chunks"].as_u64().unwrap(),
        "chunks of {n_ctx} tokens"
    );
    let bos = md.config.bos_token_id.unwrap();
    let (mut nll, mut count) = (0.0f64, 0usize);
    for ch in 0..chunks {
        let mut chunk = tokens[ch * n_ctx..(ch + 1) * n_ctx].to_vec();
        chunk[0] = bos;
        let rows = engine_logits(&md, &chunk);
        for j in n_ctx / 2..n_ctx - 1 {
            let row = &rows[j];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
            nll += lse - row[chunk[j + 1] as usize] as f64;
            count += 1;
        }
    }
    let ppl = (nll / count as f64).exp();
    let theirs = reference["ppl"].as_f64().unwrap();
    let rel = (ppl - theirs).abs() / theirs;
    eprintln!(
        "gemma-3-270m Q4_K_M perplexity: engine {ppl:.4}, llama.cpp {theirs} ({:+.3} %)",
        100.0 * (ppl - theirs) / theirs
    );
    assert!(
        rel <= 0.005,
        "perplexity {ppl} vs llama.cpp's {theirs}: {:.3} % apart",
        100.0 * rel
    );
}
