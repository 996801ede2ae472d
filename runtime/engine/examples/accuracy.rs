//! How far one model file's products are from the exact product of the same weights: the file (run
//! by the engine as it serves it — integer dot products over 8-bit activation blocks for quantized
//! weights) against a REFERENCE file holding the same weights widened to f32 (run by the f32 path).
//! `bench/accuracy.sh` makes the pairs with llama.cpp's `llama-quantize` and runs this per format.
//!
//! ```text
//! cargo run --release -p modelfleet-engine --example accuracy -- MODEL REFERENCE TEXT
//!     [--threads N] [--window N] [--windows N] [--prompts N] [--gen N]
//! ```
//!
//! Reports, as one JSON line:
//! - perplexity of both on TEXT (the first `--windows` windows of `--window` tokens, each scored on
//!   every position after its first, windows independent), its relative change, the mean KL
//!   divergence of the model's next-token distribution from the reference's, the largest |Δlogit|,
//!   and the share of positions with the same top-1;
//! - greedy agreement: the reference generates `--gen` tokens greedily after each of `--prompts`
//!   prompts (slices of TEXT); the model is then run over each sequence and its top-1 compared with
//!   the reference's token at every generated position (teacher-forced, so one difference does not
//!   derail the rest).

use modelfleet_engine::ModelDir;
use modelfleet_engine::kernels::Kernels;
use modelfleet_engine::kernels::cpu::CpuKernels;
use modelfleet_engine::kv::{FreeListPool, KvCacheManager};
use modelfleet_engine::model::{Decoder, LogitsRows, SeqInput};
use std::path::Path;

type Error = Box<dyn std::error::Error>;

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

/// `log softmax(v)` in f64.
fn log_softmax(v: &[f32]) -> Vec<f64> {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = v.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
    v.iter().map(|&x| x as f64 - lse).collect()
}

/// One loaded model file.
struct Model {
    md: ModelDir,
    model: Decoder<CpuKernels>,
}

impl Model {
    fn open(path: &str, kernels: &CpuKernels) -> Result<Self, Error> {
        let md = ModelDir::open(Path::new(path))?;
        let model = Decoder::load(kernels, md.config.clone(), &md.weights)?;
        Ok(Self { md, model })
    }

    /// The logits at every position of `tokens`, in one forward pass.
    fn logits(&self, kernels: &CpuKernels, tokens: &[u32]) -> Result<Vec<Vec<f32>>, Error> {
        let block = 16;
        let groups = self.model.kv_groups();
        let blocks = (tokens.len().div_ceil(block) + 1) * groups.len();
        let mut kv = KvCacheManager::with_groups(FreeListPool::new(blocks), block, groups);
        let mut cache = self.model.new_kv_cache(kernels, blocks, block);
        let table = kv.allocate_slots(0, 0, tokens.len())?.to_vec();
        let input = SeqInput {
            tokens,
            start_pos: 0,
            block_tables: &table,
            logits: LogitsRows::All,
            adapter: None,
        };
        let out = self.model.forward(kernels, &[input], &mut cache)?;
        let vocab = self.md.config.vocab_size;
        Ok(out.seq(0).chunks(vocab).map(<[f32]>::to_vec).collect())
    }

    /// `prompt` followed by `new_tokens` greedily chosen tokens (one decode step per token).
    fn greedy(&self, kernels: &CpuKernels, prompt: &[u32], new_tokens: usize) -> Result<Vec<u32>, Error> {
        let block = 16;
        let groups = self.model.kv_groups();
        let blocks = ((prompt.len() + new_tokens).div_ceil(block) + 1) * groups.len();
        let mut kv = KvCacheManager::with_groups(FreeListPool::new(blocks), block, groups);
        let mut cache = self.model.new_kv_cache(kernels, blocks, block);
        let mut seq = prompt.to_vec();
        let mut start = 0;
        while seq.len() < prompt.len() + new_tokens {
            let table = kv.allocate_slots(0, start, seq.len() - start)?.to_vec();
            let input = SeqInput {
                tokens: &seq[start..],
                start_pos: start,
                block_tables: &table,
                logits: LogitsRows::Last,
                adapter: None,
            };
            let out = self.model.forward(kernels, &[input], &mut cache)?;
            start = seq.len();
            seq.push(argmax(out.last(0).ok_or("no logits")?));
        }
        Ok(seq)
    }
}

/// Sums over the scored positions of the text.
#[derive(Default)]
struct Text {
    positions: usize,
    nll_model: f64,
    nll_reference: f64,
    kld: f64,
    same_top1: usize,
    max_delta: f32,
}

impl Text {
    fn add(&mut self, model: &[Vec<f32>], reference: &[Vec<f32>], tokens: &[u32]) {
        for (i, next) in tokens.iter().enumerate().skip(1) {
            let (m, r) = (&model[i - 1], &reference[i - 1]);
            let (lm, lr) = (log_softmax(m), log_softmax(r));
            self.nll_model -= lm[*next as usize];
            self.nll_reference -= lr[*next as usize];
            self.kld += lr.iter().zip(&lm).map(|(a, b)| a.exp() * (a - b)).sum::<f64>();
            self.same_top1 += usize::from(argmax(m) == argmax(r));
            let delta = m.iter().zip(r).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            self.max_delta = self.max_delta.max(delta);
            self.positions += 1;
        }
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: accuracy MODEL REFERENCE TEXT [--threads N] [--window N] [--windows N] [--prompts N] [--gen N]";
    let [model_path, reference_path, text_path] = [1, 2, 3].map(|i| args.get(i).cloned());
    let (Some(model_path), Some(reference_path), Some(text_path)) = (model_path, reference_path, text_path)
    else {
        return Err(usage.into());
    };
    let kernels = CpuKernels::new(arg(&args, "--threads", 0));
    let (window, windows) = (arg(&args, "--window", 512), arg(&args, "--windows", 4));
    let (prompts, new_tokens) = (arg(&args, "--prompts", 4), arg(&args, "--gen", 512));
    let model = Model::open(&model_path, &kernels)?;
    let reference = Model::open(&reference_path, &kernels)?;
    let text = std::fs::read_to_string(&text_path)?;
    let tokens = model.md.tokenizer.encode(&text, false)?;
    if tokens != reference.md.tokenizer.encode(&text, false)? {
        return Err("the two files tokenize the text differently: not the same model".into());
    }
    if tokens.len() < window * windows {
        return Err(format!(
            "{text_path}: {} tokens, fewer than --windows {windows} × --window {window}",
            tokens.len()
        )
        .into());
    }

    let mut scored = Text::default();
    for w in tokens.chunks_exact(window).take(windows) {
        scored.add(&model.logits(&kernels, w)?, &reference.logits(&kernels, w)?, w);
    }

    // Prompts of 32 tokens from the text, spread over it; the reference continues each greedily.
    let (mut agreed, mut generated) = (0, 0);
    for p in 0..prompts {
        let at = p * (tokens.len() - 32) / prompts.max(1);
        let prompt = &tokens[at..at + 32];
        let seq = reference.greedy(&kernels, prompt, new_tokens)?;
        let logits = model.logits(&kernels, &seq)?;
        for (i, want) in seq.iter().enumerate().skip(prompt.len()) {
            agreed += usize::from(argmax(&logits[i - 1]) == *want);
            generated += 1;
        }
    }

    let n = scored.positions as f64;
    let (ppl_model, ppl_reference) = ((scored.nll_model / n).exp(), (scored.nll_reference / n).exp());
    println!(
        "{{\"model\": {model_path:?}, \"reference\": {reference_path:?}, \"kernels\": {:?}, \
         \"text_positions\": {}, \"ppl\": {ppl_model:.4}, \"ppl_reference\": {ppl_reference:.4}, \
         \"ppl_change_pct\": {:.4}, \"mean_kld\": {:.6}, \"text_top1_agreement\": {:.5}, \
         \"max_abs_dlogit\": {:.4}, \"greedy_tokens\": {generated}, \"greedy_agreement\": {:.5}}}",
        kernels.describe(),
        scored.positions,
        (ppl_model / ppl_reference - 1.0) * 100.0,
        scored.kld / n,
        scored.same_top1 as f64 / n,
        scored.max_delta,
        agreed as f64 / generated.max(1) as f64,
    );
    Ok(())
}
