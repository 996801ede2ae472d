//! Single-process throughput check of the engine on a model directory (e.g. one written by
//! `modelfleet-runtime gen-model DIR --shape smollm2-135m`):
//!
//! ```text
//! cargo run --release -p modelfleet-engine --example bench -- DIR [--threads N] [--prompt N] [--gen N] [--batch B]
//!     [--kv-f16]
//! ```
//!
//! `--kv-f16` keeps the KV cache in f16 (`serve --kv-cache-dtype float16`).
//!
//! Reports prefill tokens/s (one prompt of `--prompt` tokens in one step, after one untimed warm-up
//! prefill) and decode tokens/s
//! (`--batch` sequences decoding `--gen` tokens each, one step per token, greedy). Timing only — the
//! llama.cpp side-by-side benchmark lives in the benchmark script.
//!
//! With `--check-invariance` it also decodes every sequence alone and checks that each step's logits
//! are bit-identical to the batched run (batch invariance on real weights, e.g. SmolLM2's GGUF).

use modelfleet_engine::ModelDir;
use modelfleet_engine::kernels::cpu::CpuKernels;
use modelfleet_engine::kernels::{Kernels, KvDType};
use modelfleet_engine::kv::{FreeListPool, KvCacheManager};
use modelfleet_engine::model::{Decoder, LogitsRows, SeqInput};
use std::time::Instant;

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold(0, |b, (i, x)| if *x > v[b] { i } else { b }) as u32
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let check = args.iter().any(|a| a == "--check-invariance");
    let kv_dtype = if args.iter().any(|a| a == "--kv-f16") {
        KvDType::F16
    } else {
        KvDType::F32
    };
    let dir = args
        .get(1)
        .ok_or("usage: bench DIR [--threads N] [--prompt N] [--gen N] [--batch B]")?;
    let (threads, prompt_len, steps, batch) = (
        arg(&args, "--threads", 0),
        arg(&args, "--prompt", 128),
        arg(&args, "--gen", 64),
        arg(&args, "--batch", 1),
    );
    let md = ModelDir::open(std::path::Path::new(dir))?;
    let kernels = CpuKernels::new(threads);
    let model = Decoder::load(&kernels, md.config.clone(), &md.weights)?;
    let block = 16;
    let groups = model.kv_groups().clone();
    let blocks = (batch * (prompt_len + steps).div_ceil(block) + 1) * groups.len();
    let mut kv = KvCacheManager::with_groups(FreeListPool::new(blocks), block, &groups);
    let mut cache = model.new_kv_cache_as(&kernels, blocks, block, kv_dtype);
    println!("{} | {}", kernels.describe(), dir);

    let text = "The quick brown fox jumps over the lazy dog. ".repeat(prompt_len);
    let base: Vec<u32> = md
        .tokenizer
        .encode(&text, false)?
        .into_iter()
        .take(prompt_len)
        .collect();
    // One untimed prefill first, as llama-bench warms up before it measures: the first forward pass
    // also pays one-time costs (touching fresh KV-cache and activation pages, waking the threads).
    {
        let warm = u64::MAX;
        let table = kv.allocate_slots(warm, 0, base.len())?.to_vec();
        let input = SeqInput {
            tokens: &base,
            start_pos: 0,
            block_tables: &table,
            logits: LogitsRows::Last,
            adapter: None,
        };
        model.forward(&kernels, &[input], &mut cache)?;
        kv.free(warm);
    }
    // Prefill every sequence (timed on the first); sequence `b` starts `b` tokens into the text.
    let mut seqs: Vec<Vec<u32>> = Vec::new();
    let mut prefill_s = 0.0;
    let mut batched_logits: Vec<Vec<Vec<f32>>> = vec![Vec::new(); batch];
    for b in 0..batch {
        let prompt: Vec<u32> = base.iter().cycle().skip(b).take(base.len()).copied().collect();
        let table = kv.allocate_slots(b as u64, 0, prompt.len())?.to_vec();
        let t = Instant::now();
        let input = SeqInput {
            tokens: &prompt,
            start_pos: 0,
            block_tables: &table,
            logits: LogitsRows::Last,
            adapter: None,
        };
        let out = model.forward(&kernels, &[input], &mut cache)?;
        if b == 0 {
            prefill_s = t.elapsed().as_secs_f64();
        }
        let mut s = prompt;
        s.push(argmax(out.last(0).ok_or("no logits")?));
        seqs.push(s);
    }
    let n = base.len();
    println!(
        "prefill: {n} tokens in {prefill_s:.3} s = {:.1} tok/s",
        n as f64 / prefill_s
    );

    let t = Instant::now();
    for _ in 0..steps {
        let tables: Vec<Vec<Vec<u32>>> = (0..batch)
            .map(|b| {
                kv.allocate_slots(b as u64, seqs[b].len() - 1, 1)
                    .map(<[Vec<u32>]>::to_vec)
            })
            .collect::<Result<_, _>>()?;
        let inputs: Vec<SeqInput<'_>> = seqs
            .iter()
            .zip(&tables)
            .map(|(s, t)| SeqInput {
                tokens: &s[s.len() - 1..],
                start_pos: s.len() - 1,
                block_tables: t,
                logits: LogitsRows::Last,
                adapter: None,
            })
            .collect();
        let out = model.forward(&kernels, &inputs, &mut cache)?;
        let next: Vec<u32> = (0..batch).map(|b| out.last(b).map(argmax).unwrap_or(0)).collect();
        if check {
            (0..batch).for_each(|b| batched_logits[b].push(out.last(b).unwrap_or(&[]).to_vec()));
        }
        for (s, n) in seqs.iter_mut().zip(next) {
            s.push(n);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let total = steps * batch;
    println!(
        "decode: batch {batch}, {steps} steps in {secs:.3} s = {:.1} tok/s per stream, {:.1} tok/s total",
        steps as f64 / secs,
        total as f64 / secs
    );
    if check {
        // Each sequence again, alone, from its prompt: every decode step must match bit for bit.
        for (b, s) in seqs.iter().enumerate() {
            let mut kv = KvCacheManager::with_groups(FreeListPool::new(blocks), block, &groups);
            let mut cache = model.new_kv_cache_as(&kernels, blocks, block, kv_dtype);
            let n_prompt = s.len() - steps;
            for (step, want) in batched_logits[b].iter().enumerate() {
                let pos = if step == 0 { 0 } else { n_prompt + step - 1 };
                let end = n_prompt + step;
                let table = kv.allocate_slots(0, pos, end - pos)?.to_vec();
                let input = SeqInput {
                    tokens: &s[pos..end],
                    start_pos: pos,
                    block_tables: &table,
                    logits: LogitsRows::Last,
                    adapter: None,
                };
                let got = model.forward(&kernels, &[input], &mut cache)?;
                let same = got
                    .last(0)
                    .is_some_and(|g| g.iter().zip(want).all(|(x, y)| x.to_bits() == y.to_bits()));
                if !same {
                    return Err(format!(
                        "sequence {b} step {step}: logits differ alone vs in a batch of {batch}"
                    )
                    .into());
                }
            }
        }
        println!("batch invariance: {batch} sequences x {steps} steps bit-identical alone and batched");
    }
    Ok(())
}
