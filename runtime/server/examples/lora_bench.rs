//! Multi-LoRA throughput in process: the same 16-stream batch on the base model alone and mixed across
//! adapters (requests spread round-robin over them), through the step loop (`EngineHandle`, no HTTP).
//!
//! ```text
//! cargo run --release -p modelfleet-runtime --example lora_bench -- MODEL ADAPTER_DIR... \
//!     [--streams 16] [--gen 64] [--threads 2] [--runs 3]
//! ```
//!
//! Each run measures base then mixed back to back (alternating order between runs) and prints aggregate
//! output tokens/s for both and their ratio; the median ratio is the figure (ratios, not absolute
//! times: the machine is shared). Prompts are ~32 distinct tokens per stream, greedy, EOS ignored.

use modelfleet_engine::lora::{AdapterIdentity, LoraAdapter};
use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sched::{
    EngineHandle, QueueLimits, Request, RequestEvent, SchedulerConfig, TenantLimits,
};
use modelfleet_engine::{Engine, EngineConfig, ModelDir};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str, default: usize| -> usize {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let positional: Vec<&String> = {
        let mut out = Vec::new();
        let mut skip = false;
        for a in &args {
            if skip {
                skip = false;
            } else if a.starts_with("--") {
                skip = true;
            } else {
                out.push(a);
            }
        }
        out
    };
    let (model, adapter_dirs) = positional
        .split_first()
        .ok_or("usage: lora_bench MODEL ADAPTER_DIR... [--streams N] [--gen N] [--threads N] [--runs N]")?;
    let (streams, gen_tokens, threads, runs) = (
        flag("--streams", 16),
        flag("--gen", 64),
        flag("--threads", 2),
        flag("--runs", 3),
    );
    let model = PathBuf::from(model);
    let base_cfg = ModelDir::open(&model)?.config;
    let adapters: Vec<Arc<LoraAdapter>> = adapter_dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let dir = PathBuf::from(d);
            let identity = AdapterIdentity {
                name: format!("a{i}"),
                digest: modelfleet_runtime::digest::digest_path(&dir)?,
            };
            Ok(Arc::new(LoraAdapter::load(&dir, &base_cfg, 512, identity)?))
        })
        .collect::<Result<_, Error>>()?;
    if adapters.is_empty() {
        return Err("give at least one adapter directory".into());
    }
    let rank = adapters[0].rank;
    let targets = adapters[0].pairs.len() / base_cfg.num_layers;
    let path = model.clone();
    let max_loras = adapters.len();
    let handle = EngineHandle::start(
        move || {
            Engine::load(
                &path,
                &EngineConfig {
                    threads,
                    num_kv_blocks: Some(streams * 8 + 16),
                    max_model_len: Some(512),
                    max_loras,
                    ..EngineConfig::default()
                },
            )
        },
        SchedulerConfig {
            max_num_seqs: streams,
            max_num_batched_tokens: 512,
            enable_prefix_caching: false,
            max_loras,
            speculative: None,
        },
        QueueLimits {
            max_queued_requests: 1000,
            max_queued_tokens: 1_000_000,
        },
    )?;
    let vocab = handle.model_dir().config.vocab_size;
    let run = |mixed: bool| -> Result<f64, Error> {
        let t0 = Instant::now();
        let mut threads_out = Vec::new();
        for s in 0..streams {
            let prompt: Vec<u32> = (0..32u32)
                .map(|i| 200 + (i * 17 + s as u32 * 101) % 5000)
                .collect();
            let adapter = mixed.then(|| adapters[s % adapters.len()].clone());
            let r = Request {
                tenant: "bench".into(),
                cache_scope: "bench".into(),
                adapter,
                cache_salt: None,
                priority: 0,
                prompt,
                params: SamplingParams {
                    ignore_eos: true,
                    ..SamplingParams::greedy(gen_tokens)
                }
                .validate(vocab)?,
                arrival: Instant::now(),
                deadline: None,
                first_token_deadline: None,
            };
            let mut stream = handle
                .submit(r, TenantLimits::default())
                .map_err(|e| e.to_string())?;
            threads_out.push(std::thread::spawn(move || {
                let mut n = 0usize;
                while let Some(ev) = stream.blocking_next() {
                    match ev {
                        RequestEvent::Token(_) => n += 1,
                        RequestEvent::Finished(_) => break,
                    }
                }
                n
            }));
        }
        let tokens: usize = threads_out.into_iter().map(|t| t.join().unwrap_or(0)).sum();
        Ok(tokens as f64 / t0.elapsed().as_secs_f64())
    };
    // Warm-up (first touches of weights and KV pages).
    run(false)?;
    run(true)?;
    println!(
        "| run | base tok/s | mixed over {} adapters (rank {rank}, {targets} targets) tok/s | ratio |",
        adapters.len()
    );
    println!("|---|---|---|---|");
    let mut ratios = Vec::new();
    for i in 0..runs {
        let (base, mixed) = if i % 2 == 0 {
            let b = run(false)?;
            (b, run(true)?)
        } else {
            let m = run(true)?;
            (run(false)?, m)
        };
        ratios.push(mixed / base);
        println!("| {i} | {base:.1} | {mixed:.1} | {:.3} |", mixed / base);
    }
    ratios.sort_by(|a, b| a.total_cmp(b));
    println!(
        "\nmedian ratio mixed/base: {:.3} ({streams} streams, {gen_tokens} tokens each, {threads} threads)",
        ratios[ratios.len() / 2]
    );
    Ok(())
}
