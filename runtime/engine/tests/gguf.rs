//! GGUF models: `gen-model --format gguf` output against the same model in safetensors (same weights,
//! Q/K permuted, adjacent-pair RoPE: the logits must agree), against candle's independent GGUF Llama
//! (`quantized_llama`) in f32, Q8_0, Q4_0 and a mix of Q4_K, Q6_K, Q5_0 and Q5_1, and malformed files
//! reported with the file and key named.

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama;
use modelfleet_engine::ModelDir;
use modelfleet_engine::kernels::cpu::CpuKernels;
use modelfleet_engine::kv::{FreeListPool, KvCacheManager};
use modelfleet_engine::model::{Decoder, LogitsRows, SeqInput};
use modelfleet_engine::tokenizer::ChatMessage;
use modelfleet_testkit::gen_model::{GenDType, GenFormat, Shape};
use std::path::Path;

mod common;

fn generate(shape: Shape, dtype: GenDType, format: GenFormat) -> tempfile::TempDir {
    common::generated(shape, 11, dtype, format)
}

/// The chat prompt's tokens and the engine's logits at every position.
fn engine_logits(md: &ModelDir) -> (Vec<u32>, Vec<Vec<f32>>) {
    let text = md
        .chat_template
        .as_ref()
        .unwrap()
        .render(
            &[ChatMessage::new(
                "user",
                "Tell me a story about the stars, 42 times.",
            )],
            true,
        )
        .unwrap();
    let prompt = md.tokenizer.encode(&text, false).unwrap();
    let kernels = CpuKernels::new(0);
    let model = Decoder::load(&kernels, md.config.clone(), &md.weights).unwrap();
    let mut kv = KvCacheManager::new(FreeListPool::new(16), 16);
    let mut cache = model.new_kv_cache(&kernels, 16, 16);
    let table = kv.allocate_slots(0, 0, prompt.len()).unwrap().to_vec();
    let seq = SeqInput {
        tokens: &prompt,
        start_pos: 0,
        block_tables: &table,
        logits: LogitsRows::All,
        adapter: None,
    };
    let out = model.forward(&kernels, &[seq], &mut cache).unwrap();
    let rows = out
        .seq(0)
        .chunks(md.config.vocab_size)
        .map(<[f32]>::to_vec)
        .collect();
    (prompt, rows)
}

/// The largest |Δlogit| over all positions, and the share of positions with the same top-1.
fn compare(a: &[Vec<f32>], b: &[Vec<f32>]) -> (f32, f64) {
    let worst = a.iter().zip(b).map(|(x, y)| max_delta(x, y)).fold(0.0, f32::max);
    let same = a.iter().zip(b).filter(|(x, y)| argmax(x) == argmax(y)).count();
    (worst, same as f64 / a.len() as f64)
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

fn max_delta(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn f32_gguf_is_the_same_model_as_safetensors() {
    for shape in [
        Shape::Tiny,
        Shape::TinyLlama3,
        Shape::TinyMistral,
        Shape::TinyQwen2,
    ] {
        let st = ModelDir::open(generate(shape, GenDType::F32, GenFormat::Safetensors).path()).unwrap();
        let dir = generate(shape, GenDType::F32, GenFormat::Gguf);
        let gg = ModelDir::open(dir.path()).unwrap();
        assert_eq!(gg.config.rope_interleaved, shape != Shape::TinyQwen2, "{shape:?}");
        assert!(st.eos_token_ids.contains(&gg.eos_token_ids[0]), "{shape:?}");
        let (p1, l1) = engine_logits(&st);
        let (p2, l2) = engine_logits(&gg);
        assert_eq!(
            p1, p2,
            "{shape:?}: the GGUF tokenizer and template give the same prompt tokens"
        );
        for (pos, (a, b)) in l1.iter().zip(&l2).enumerate() {
            assert!(
                max_delta(a, b) < 1e-4,
                "{shape:?} position {pos}: {}",
                max_delta(a, b)
            );
            assert_eq!(argmax(a), argmax(b), "{shape:?} position {pos}");
        }
    }
}

/// candle's quantized Llama, one position at a time.
fn candle_logits(file: &Path, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut f = std::fs::File::open(file).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut model = quantized_llama::ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap();
    tokens
        .iter()
        .enumerate()
        .map(|(pos, &t)| {
            let input = Tensor::new(&[t], &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            model
                .forward(&input, pos)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

#[test]
fn gguf_matches_candle_quantized_llama() {
    use modelfleet_engine::kernels::cpu::simd::Isa;
    let int8 = Isa::detect().has_avx2();
    for (shape, dtype, tol, min_top1) in [
        (Shape::Tiny, GenDType::F32, 2e-2, 1.0),
        (Shape::TinyMistral, GenDType::F32, 2e-2, 1.0),
        // With AVX2 both quantize the activations of quantized products to 8 bits (ggml's
        // vec_dot_type), so Q8_0 agrees to the last bit and Q4_0 within f32 rounding amplified by
        // 8-bit steps; the portable kernels keep f32 activations, further from candle.
        (
            Shape::Tiny,
            GenDType::Q8_0,
            if int8 { 1e-3 } else { 0.15 },
            if int8 { 1.0 } else { 0.95 },
        ),
        (
            Shape::Tiny,
            GenDType::Q4_0,
            if int8 { 0.15 } else { 0.5 },
            if int8 { 1.0 } else { 0.85 },
        ),
    ] {
        let dir = generate(shape, dtype, GenFormat::Gguf);
        let md = ModelDir::open(dir.path()).unwrap();
        let (prompt, ours) = engine_logits(&md);
        let theirs = candle_logits(&dir.path().join("model.gguf"), &prompt);
        let (worst, frac) = compare(&ours, &theirs);
        eprintln!(
            "{shape:?} {dtype:?}: {} positions, max |Δlogit| {worst:.2e}, top-1 agreement {frac:.3}",
            ours.len()
        );
        assert!(worst <= tol, "{shape:?} {dtype:?}: max |Δlogit| {worst}");
        assert!(frac >= min_top1, "{shape:?} {dtype:?}: top-1 agreement {frac}");
    }
}

/// Rewrites `dir/model.gguf` (f32) with every matrix requantized by candle to the format `pick` names
/// for its tensor name (vectors stay f32).
fn requantize(dir: &Path, pick: impl Fn(&str) -> GgmlDType) {
    let src = dir.join("model.gguf");
    let mut f = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, QTensor)> = names
        .into_iter()
        .map(|name| {
            let t = content.tensor(&mut f, name, &Device::Cpu).unwrap();
            if t.shape().dims().len() != 2 {
                return (name.clone(), t);
            }
            let w = t.dequantize(&Device::Cpu).unwrap();
            (name.clone(), QTensor::quantize(&w, pick(name)).unwrap())
        })
        .collect();
    let meta: Vec<(&str, &gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let tmp = dir.join("model.q.gguf");
    gguf_file::write(&mut std::fs::File::create(&tmp).unwrap(), &meta, &ts).unwrap();
    std::fs::rename(tmp, src).unwrap();
}

/// The formats of a llama.cpp Q4_K_M file (Q4_K, Q6_K for the MLP's down projection and the LM head,
/// Q5_0 where a width is not a multiple of 256) plus Q5_1, on a model whose widths allow K-quants: the
/// engine's integer products (activations in 8-bit blocks of 32) against candle's (ggml's: blocks of
/// 256 for the K-quants, of 32 for Q5).
#[test]
fn k_quants_and_q5_match_candle_quantized_llama() {
    use modelfleet_engine::kernels::cpu::simd::Isa;
    let int8 = Isa::detect().has_avx2();
    let pick = |name: &str| {
        if name.contains("ffn_down") || name.starts_with("output") {
            GgmlDType::Q6K
        } else if name.contains("attn_v") {
            GgmlDType::Q5_0
        } else if name.starts_with("token_embd") {
            GgmlDType::Q5_1
        } else {
            GgmlDType::Q4K
        }
    };
    let dir = generate(Shape::Tiny256, GenDType::F32, GenFormat::Gguf);
    requantize(dir.path(), pick);
    // The same quantized weights widened back to f32: the exact product of these weights.
    let exact_dir = generate(Shape::Tiny256, GenDType::F32, GenFormat::Gguf);
    requantize(exact_dir.path(), pick);
    requantize(exact_dir.path(), |_| GgmlDType::F32);
    let (prompt, ours) = engine_logits(&ModelDir::open(dir.path()).unwrap());
    let (_, exact) = engine_logits(&ModelDir::open(exact_dir.path()).unwrap());
    let theirs = candle_logits(&dir.path().join("model.gguf"), &prompt);
    let (ours_exact, ours_exact_top1) = compare(&ours, &exact);
    let (theirs_exact, theirs_exact_top1) = compare(&theirs, &exact);
    let (ours_theirs, _) = compare(&ours, &theirs);
    eprintln!(
        "Q4_K/Q6_K/Q5_0/Q5_1 (int8 {int8}), {} positions, max |Δlogit| and top-1 agreement against the \
         exact f32 product: ours {ours_exact:.2e} {ours_exact_top1:.3}, candle {theirs_exact:.2e} \
         {theirs_exact_top1:.3}; ours against candle {ours_theirs:.2e}",
        ours.len()
    );
    // Both carry 8-bit activation noise, independently; ours (blocks of 32) no more than candle's
    // (blocks of 256 for the K-quants), and the two within that noise of each other.
    assert!(
        ours_exact <= theirs_exact * 1.25 + 1e-3,
        "ours {ours_exact} vs candle {theirs_exact}"
    );
    assert!(ours_theirs <= 0.2, "ours against candle: {ours_theirs}");
    assert!(
        ours_exact_top1 >= theirs_exact_top1 - 0.03,
        "top-1 {ours_exact_top1} vs {theirs_exact_top1}"
    );
}

#[test]
fn malformed_gguf_files_name_the_file_and_the_problem() {
    let dir = generate(Shape::Tiny, GenDType::Q8_0, GenFormat::Gguf);
    let path = dir.path().join("model.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let check = |data: &[u8], want: &str| {
        std::fs::write(&path, data).unwrap();
        let e = ModelDir::open(dir.path()).err().expect("an error").to_string();
        assert!(e.contains("model.gguf") && e.contains(want), "{e} lacks {want}");
    };
    check(&bytes[..bytes.len() / 2], "runs past the end of the file");
    check(&bytes[..300], "truncated or corrupt GGUF");
    check(b"GGML0000", "bad magic");
    let mut other = bytes.clone();
    let at = bytes.windows(5).position(|w| w == b"llama").unwrap();
    other[at..at + 5].copy_from_slice(b"gpt-x");
    check(&other, "general.architecture");
    let mut spm = bytes.clone();
    let key = bytes
        .windows(20)
        .position(|w| w == b"tokenizer.ggml.model")
        .unwrap();
    let at = key + bytes[key..].windows(4).position(|w| w == b"gpt2").unwrap();
    spm[at..at + 4].copy_from_slice(b"bert");
    check(&spm, "`tokenizer.ggml.model` \"bert\" is not supported");
    std::fs::write(&path, &bytes).unwrap();
    std::fs::write(dir.path().join("second.gguf"), &bytes).unwrap();
    let e = ModelDir::open(dir.path()).err().expect("two files").to_string();
    assert!(e.contains("holds 2 .gguf files"), "{e}");
    assert!(
        ModelDir::open(&path).is_ok(),
        "a file path names the model directly"
    );
}
