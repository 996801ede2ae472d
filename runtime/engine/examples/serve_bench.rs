//! In-process serving benchmark of Engine II: the step loop driven through [`EngineHandle`] (no
//! HTTP), each request's stream consumed on its own thread with `blocking_next`.
//!
//! ```text
//! cargo run --release -p modelfleet-engine --example serve_bench -- MODEL [--threads N] [--gen N]
//!     [--streams 1,4,16,64] [--overhead-seqs N] [--overhead-gen N] [--waste-seqs N] [--seed N]
//!     [--max-num-batched-tokens N] [--skip a,b,c,d]
//! ```
//!
//! MODEL is a Hugging Face directory or a GGUF file (e.g. written by `modelfleet-runtime gen-model DIR
//! --shape smollm2-135m --dtype f16 --format gguf`). Four measurements, printed as one Markdown table:
//!
//! - (a) throughput: N streams at once (N in `--streams`), each a distinct ~32-token prompt, greedy,
//!   EOS ignored, `--gen` new tokens; aggregate output tokens/s over the whole run (first submit to
//!   last `Finished`), p50/p99 inter-token latency over every gap between two tokens of one stream,
//!   and p50 time to first token;
//! - (b) prefix cache: time to first token of a 1,000-token shared system prompt + a short user
//!   suffix with a cold cache, then with a warm one (same system prompt, another suffix); median of
//!   three system prompts;
//! - (c) scheduler overhead: `--overhead-seqs` requests at once (all running together: max_num_seqs
//!   and the KV pool are sized for them), `schedule_seconds / (schedule_seconds + model_seconds)`;
//! - (d) KV waste: `--waste-seqs` requests at once with prompts of 50–1,000 tokens and outputs of
//!   50–500 tokens (seeded), the peak of `kv_slots_unused` against one partly filled block per
//!   sequence, `seqs × (block_size − 1)`.

use modelfleet_engine::kernels::Kernels;
use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sched::{
    EngineHandle, QueueLimits, Request, RequestEvent, SchedulerConfig, Stats, TenantLimits,
};
use modelfleet_engine::stop::FinishReason;
use modelfleet_engine::{Engine, EngineConfig, ModelDir};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::time::Instant;

type Error = Box<dyn std::error::Error + Send + Sync>;

const BLOCK_SIZE: usize = 16;

/// One of the four measurements, appending its rows.
type Part = fn(&Args, &mut Vec<Row>) -> Result<(), Error>;

struct Args {
    model: PathBuf,
    threads: usize,
    gen_tokens: usize,
    streams: Vec<usize>,
    overhead_seqs: usize,
    overhead_gen: usize,
    waste_seqs: usize,
    seed: u64,
    max_num_batched_tokens: usize,
    skip: Vec<String>,
}

fn parse_args() -> Result<Args, Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .ok_or("usage: serve_bench MODEL [--threads N] [--gen N] [--streams 1,4,16,64] ...")?;
    let get = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let num = |name: &str, default: usize| -> Result<usize, Error> {
        get(name).map_or(Ok(default), |v| {
            v.parse().map_err(|_| format!("{name}: not a number: {v}").into())
        })
    };
    let streams = get("--streams")
        .unwrap_or_else(|| "1,4,16,64".into())
        .split(',')
        .map(|s| s.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--streams: {e}"))?;
    Ok(Args {
        model: PathBuf::from(model),
        threads: num("--threads", 2)?,
        gen_tokens: num("--gen", 128)?,
        streams,
        overhead_seqs: num("--overhead-seqs", 256)?,
        overhead_gen: num("--overhead-gen", 32)?,
        waste_seqs: num("--waste-seqs", 64)?,
        seed: num("--seed", 1)? as u64,
        max_num_batched_tokens: num("--max-num-batched-tokens", 512)?,
        skip: get("--skip")
            .map(|s| s.split(',').map(str::to_owned).collect())
            .unwrap_or_default(),
    })
}

/// Starts a step loop on `model` sized for `max_num_seqs` sequences and `num_kv_blocks` blocks.
fn start(a: &Args, max_num_seqs: usize, num_kv_blocks: usize) -> Result<EngineHandle, Error> {
    let (path, threads) = (a.model.clone(), a.threads);
    let cfg = SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens: a.max_num_batched_tokens,
        enable_prefix_caching: true,
        max_loras: 4,
        speculative: None,
    };
    let limits = QueueLimits {
        max_queued_requests: 100_000,
        max_queued_tokens: usize::MAX / 2,
    };
    let h = EngineHandle::start(
        move || {
            Engine::load(
                &path,
                &EngineConfig {
                    threads,
                    block_size: BLOCK_SIZE,
                    num_kv_blocks: Some(num_kv_blocks),
                    max_model_len: Some(4096),
                    ..EngineConfig::default()
                },
            )
        },
        cfg,
        limits,
    )?;
    Ok(h)
}

/// `n` prompt tokens of ordinary text (random words drawn from `rng`, so every call differs).
fn text_prompt(md: &ModelDir, n: usize, rng: &mut ChaCha8Rng) -> Result<Vec<u32>, Error> {
    const WORDS: &[&str] = &[
        "the", "server", "model", "answers", "quick", "brown", "fox", "cluster", "tenant", "request",
        "token", "cache", "block", "prefix", "stream", "engine", "batch", "river", "mountain", "green",
        "seven", "orange", "window", "garden", "silver", "planet", "music", "letter", "paper", "stone",
        "winter", "summer", "number", "market", "bridge", "forest", "doctor", "engineer", "table", "light",
    ];
    let mut text = String::new();
    let mut ids = Vec::new();
    while ids.len() < n {
        for _ in 0..n.max(8) {
            text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
            text.push(if rng.random_range(0..8) == 0 { '.' } else { ' ' });
        }
        ids = md.tokenizer.encode(&text, false)?;
    }
    ids.truncate(n);
    Ok(ids)
}

fn request(md: &ModelDir, tenant: &str, prompt: Vec<u32>, max_tokens: usize) -> Result<Request, Error> {
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    }
    .validate(md.config.vocab_size)?;
    Ok(Request {
        tenant: tenant.into(),
        cache_scope: tenant.into(),
        adapter: None,
        cache_salt: None,
        priority: 0,
        prompt,
        params,
        arrival: Instant::now(),
        deadline: None,
        first_token_deadline: None,
    })
}

/// What one consumed request looked like.
struct Trace {
    submitted: Instant,
    tokens: Vec<Instant>,
    reason: FinishReason,
    cached_tokens: usize,
    completion_tokens: usize,
}

/// Submits every request at once, consumes each stream on its own thread, and waits for all.
fn run_all(h: &EngineHandle, reqs: Vec<Request>) -> Result<Vec<Trace>, Error> {
    std::thread::scope(|s| {
        let mut joins = Vec::new();
        for r in reqs {
            let submitted = Instant::now();
            let mut stream = h
                .submit(r, TenantLimits::default())
                .map_err(|e| format!("refused: {e}"))?;
            joins.push(s.spawn(move || -> Result<Trace, String> {
                let mut tokens = Vec::new();
                loop {
                    match stream.blocking_next() {
                        Some(RequestEvent::Token(_)) => tokens.push(Instant::now()),
                        Some(RequestEvent::Finished(f)) => {
                            if matches!(f.reason, FinishReason::Error | FinishReason::Cancelled) {
                                return Err(format!(
                                    "request ended with {}: {:?}",
                                    f.reason.as_str(),
                                    f.message
                                ));
                            }
                            return Ok(Trace {
                                submitted,
                                tokens,
                                reason: f.reason,
                                cached_tokens: f.usage.cached_tokens,
                                completion_tokens: f.usage.completion_tokens,
                            });
                        }
                        None => return Err("stream ended without Finished".into()),
                    }
                }
            }));
        }
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .map_err(|_| Error::from("consumer thread panicked"))?
                    .map_err(Error::from)
            })
            .collect()
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn overhead(before: &Stats, after: &Stats) -> (f64, f64, u64) {
    let sched = after.schedule_seconds - before.schedule_seconds;
    let model = after.model_seconds - before.model_seconds;
    let steps = after.steps - before.steps;
    (
        sched / (sched + model).max(1e-12),
        sched / steps.max(1) as f64,
        steps,
    )
}

struct Row {
    metric: String,
    value: String,
    target: String,
}

fn row(metric: impl Into<String>, value: impl Into<String>, target: impl Into<String>) -> Row {
    Row {
        metric: metric.into(),
        value: value.into(),
        target: target.into(),
    }
}

/// (a) aggregate throughput and inter-token latency at each concurrency.
fn throughput(a: &Args, rows: &mut Vec<Row>) -> Result<(), Error> {
    let most = a.streams.iter().copied().max().unwrap_or(1);
    let blocks = most * (32 + a.gen_tokens).div_ceil(BLOCK_SIZE) + 16;
    let h = start(a, most.max(1), blocks)?;
    let md = h.model_dir().clone();
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed);
    // Warm-up (page in the weights, start the thread pool).
    run_all(
        &h,
        vec![request(&md, "warmup", text_prompt(&md, 32, &mut rng)?, 8)?],
    )?;
    for &n in &a.streams {
        let reqs = (0..n)
            .map(|i| {
                request(
                    &md,
                    &format!("t{i}"),
                    text_prompt(&md, 32, &mut rng)?,
                    a.gen_tokens,
                )
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let before = h.stats();
        let t0 = Instant::now();
        let traces = run_all(&h, reqs)?;
        let wall = t0.elapsed().as_secs_f64();
        let after = h.stats();
        let total: usize = traces.iter().map(|t| t.completion_tokens).sum();
        if traces
            .iter()
            .any(|t| t.reason != FinishReason::Length || t.tokens.len() != a.gen_tokens)
        {
            return Err("a throughput request did not generate all its tokens".into());
        }
        let itl = sorted(
            traces
                .iter()
                .flat_map(|t| t.tokens.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3))
                .collect(),
        );
        let ttft = sorted(
            traces
                .iter()
                .map(|t| (t.tokens[0] - t.submitted).as_secs_f64() * 1e3)
                .collect(),
        );
        let (ovh, _, steps) = overhead(&before, &after);
        let target = match n {
            1 => "llama-server -np 16: ≈100",
            16 => "≥ 470 (llama-server -np 16: ≈315)",
            _ => "",
        };
        rows.push(row(
            format!("(a) {n} stream(s): aggregate output tok/s"),
            format!("{:.1}", total as f64 / wall),
            target,
        ));
        rows.push(row(
            format!("(a) {n} stream(s): inter-token latency p50 / p99 (ms)"),
            format!("{:.1} / {:.1}", percentile(&itl, 0.5), percentile(&itl, 0.99)),
            "",
        ));
        rows.push(row(
            format!("(a) {n} stream(s): TTFT p50 (ms); steps; scheduler share"),
            format!("{:.0}; {steps}; {:.2}%", percentile(&ttft, 0.5), ovh * 100.0),
            "",
        ));
        eprintln!("  (a) {n} streams: {total} tokens in {wall:.2} s");
    }
    Ok(())
}

/// (b) time to first token with a 1,000-token shared system prompt, cold vs warm prefix cache.
fn prefix_ttft(a: &Args, rows: &mut Vec<Row>) -> Result<(), Error> {
    let h = start(a, 8, 1024)?;
    let md = h.model_dir().clone();
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed + 100);
    run_all(
        &h,
        vec![request(&md, "warmup", text_prompt(&md, 32, &mut rng)?, 4)?],
    )?;
    let (mut cold, mut warm, mut cached) = (Vec::new(), Vec::new(), 0);
    for rep in 0..3 {
        let system = text_prompt(&md, 1000, &mut rng)?;
        let tenant = format!("tenant{rep}");
        let mut ttft = |suffix_len: usize| -> Result<(f64, usize), Error> {
            let mut p = system.clone();
            p.extend(text_prompt(&md, suffix_len, &mut rng)?);
            let t = run_all(&h, vec![request(&md, &tenant, p, 1)?])?.remove(0);
            Ok(((t.tokens[0] - t.submitted).as_secs_f64() * 1e3, t.cached_tokens))
        };
        let (c, c_cached) = ttft(12)?;
        let (w, w_cached) = ttft(15)?;
        if c_cached != 0 {
            return Err(format!("the cold request found {c_cached} cached tokens").into());
        }
        cold.push(c);
        warm.push(w);
        cached = w_cached;
    }
    let (c, w) = (percentile(&sorted(cold), 0.5), percentile(&sorted(warm), 0.5));
    rows.push(row(
        "(b) TTFT, 1,000-token system prompt, cold cache (ms)",
        format!("{c:.1}"),
        "",
    ));
    rows.push(row(
        "(b) TTFT, same system prompt, warm cache (ms)",
        format!("{w:.1} ({cached} prompt tokens cached)"),
        "",
    ));
    rows.push(row("(b) warm / cold", format!("{:.1}%", w / c * 100.0), "≤ 15%"));
    Ok(())
}

/// (c) scheduler overhead with many sequences running together.
fn sched_overhead(a: &Args, rows: &mut Vec<Row>) -> Result<(), Error> {
    let n = a.overhead_seqs;
    let blocks = n * (32 + a.overhead_gen).div_ceil(BLOCK_SIZE) + 16;
    let h = start(a, n, blocks)?;
    let md = h.model_dir().clone();
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed + 200);
    let reqs = (0..n)
        .map(|i| {
            request(
                &md,
                &format!("t{}", i % 8),
                text_prompt(&md, 32, &mut rng)?,
                a.overhead_gen,
            )
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let before = h.stats();
    let t0 = Instant::now();
    let traces = run_all(&h, reqs)?;
    let wall = t0.elapsed().as_secs_f64();
    let after = h.stats();
    let (share, per_step, steps) = overhead(&before, &after);
    let total: usize = traces.iter().map(|t| t.completion_tokens).sum();
    if after.counters.preemptions != before.counters.preemptions {
        eprintln!(
            "  (c) note: {} preemptions",
            after.counters.preemptions - before.counters.preemptions
        );
    }
    rows.push(row(
        format!(
            "(c) scheduler share of step time, {n} sequences × {} new tokens",
            a.overhead_gen
        ),
        format!(
            "{:.2}% ({:.0} µs/step over {steps} steps)",
            share * 100.0,
            per_step * 1e6
        ),
        "≤ 2%",
    ));
    rows.push(row(
        format!("(c) {n} sequences: aggregate output tok/s"),
        format!("{:.1}", total as f64 / wall),
        "",
    ));
    Ok(())
}

/// (d) KV slots allocated but holding no token, at peak.
fn kv_waste(a: &Args, rows: &mut Vec<Row>) -> Result<(), Error> {
    let n = a.waste_seqs;
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed + 300);
    let shapes: Vec<(usize, usize)> = (0..n)
        .map(|_| (rng.random_range(50..=1000), rng.random_range(50..=500)))
        .collect();
    // Room for every sequence at its longest, so nothing is preempted.
    let blocks = shapes
        .iter()
        .map(|(p, g)| (p + g).div_ceil(BLOCK_SIZE))
        .sum::<usize>()
        + 16;
    let h = start(a, n, blocks)?;
    let md = h.model_dir().clone();
    let reqs = shapes
        .iter()
        .enumerate()
        .map(|(i, &(p, g))| request(&md, &format!("t{}", i % 4), text_prompt(&md, p, &mut rng)?, g))
        .collect::<Result<Vec<_>, Error>>()?;
    let t0 = Instant::now();
    run_all(&h, reqs)?;
    let s = h.stats();
    let bound = n * (BLOCK_SIZE - 1);
    rows.push(row(
        format!("(d) KV slots allocated, no token, at peak ({n} sequences, block {BLOCK_SIZE})"),
        format!(
            "{} (bound {n} × {} = {bound}; {:.1}% of it); {} blocks, {} preemptions, {:.1} s",
            s.kv_slots_unused_peak,
            BLOCK_SIZE - 1,
            s.kv_slots_unused_peak as f64 / bound as f64 * 100.0,
            blocks,
            s.counters.preemptions,
            t0.elapsed().as_secs_f64()
        ),
        "≤ one partly filled block per sequence",
    ));
    Ok(())
}

fn main() -> Result<(), Error> {
    let a = parse_args()?;
    let t0 = Instant::now();
    let describe = modelfleet_engine::kernels::cpu::CpuKernels::new(a.threads).describe();
    let name = Path::new(&a.model)
        .components()
        .rev()
        .find_map(|c| {
            let s = c.as_os_str().to_string_lossy();
            (s != "model.gguf").then(|| s.into_owned())
        })
        .unwrap_or_default();
    eprintln!("serve_bench: {} ({describe})", a.model.display());
    let mut rows = Vec::new();
    let parts: [(&str, Part); 4] = [
        ("a", throughput),
        ("b", prefix_ttft),
        ("c", sched_overhead),
        ("d", kv_waste),
    ];
    for (key, f) in parts {
        if a.skip.iter().any(|s| s == key) {
            continue;
        }
        let t = Instant::now();
        f(&a, &mut rows)?;
        eprintln!("  ({key}) done in {:.1} s", t.elapsed().as_secs_f64());
    }
    println!(
        "\n### {name} — {} threads, greedy, EOS ignored, block size {BLOCK_SIZE}, max_num_batched_tokens {}\n",
        a.threads, a.max_num_batched_tokens
    );
    println!("| measurement | value | target / peer |");
    println!("|---|---|---|");
    for r in rows {
        println!("| {} | {} | {} |", r.metric, r.value, r.target);
    }
    println!("\n{describe}; whole run {:.0} s", t0.elapsed().as_secs_f64());
    Ok(())
}
