//! What a speculative verification step costs against a plain decode step, on one model file:
//! `streams` sequences hold a `--context`-token prompt in the KV cache, then steps in which every
//! sequence scores n positions (its last token and n − 1 drafts, all with logits, as verification
//! does) are timed for each n of `--rows`, in an order rotating every round so a drift of the
//! machine's speed favours none. Each round's step of n rows is divided by the same round's plain
//! step (n = 1): the printed ratio is the median of those per-round ratios with its min–max.
//!
//! ```text
//! cargo run --release -p modelfleet-engine --example verify_bench -- MODEL [--threads N]
//!     [--context L] [--streams S] [--rounds R] [--rows 1,2,3,5,9] [--kv-f16] [--cpu-time]
//! ```
//!
//! `--cpu-time` times the calling thread's CPU time instead of the wall clock (with `--threads 1`: a
//! step's own work, whatever else the machine runs; on a shared, loaded machine the wall clock mostly
//! measures the other tenants).
//!
//! Speculation pays when a step of 1 + k positions costs little more than one of 1: with every draft
//! accepted, k + 1 tokens cost t(k + 1) instead of (k + 1) · t(1).

use modelfleet_engine::ModelDir;
use modelfleet_engine::kernels::cpu::CpuKernels;
use modelfleet_engine::kernels::{Kernels, KvDType};
use modelfleet_engine::kv::{FreeListPool, KvCache, KvCacheManager};
use modelfleet_engine::model::{Decoder, LogitsRows, SeqInput};
use std::time::Instant;

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The calling thread's CPU time in seconds.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; the clock id is a constant the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The command line (see the module header).
struct Opts {
    dir: String,
    threads: usize,
    context: usize,
    streams: usize,
    rounds: usize,
    rows: Vec<usize>,
    cpu_time: bool,
    kv_dtype: KvDType,
}

impl Opts {
    fn parse() -> Result<Self, Box<dyn std::error::Error>> {
        let args: Vec<String> = std::env::args().collect();
        let dir = args
            .get(1)
            .ok_or("usage: verify_bench MODEL [--threads N] [--context L] ...")?
            .clone();
        Ok(Self {
            dir,
            threads: arg(&args, "--threads", 0usize),
            context: arg(&args, "--context", 600usize),
            streams: arg(&args, "--streams", 1usize).max(1),
            rounds: arg(&args, "--rounds", 20usize).max(1),
            rows: arg(&args, "--rows", "1,2,3,4,5,6,8,9".to_string())
                .split(',')
                .filter_map(|v| v.parse().ok())
                .filter(|&n| n >= 1)
                .collect(),
            cpu_time: args.iter().any(|a| a == "--cpu-time"),
            kv_dtype: if args.iter().any(|a| a == "--kv-f16") {
                KvDType::F16
            } else {
                KvDType::F32
            },
        })
    }
}

/// A stream's tokens and block table.
type Stream = (Vec<u32>, Vec<Vec<u32>>);

/// Each stream's prompt (`context` tokens, then `max_rows` more to score) and block table, the
/// prompt's first `context` tokens already in `cache`.
fn fill(
    o: &Opts,
    md: &ModelDir,
    (kernels, model): (&CpuKernels, &Decoder<CpuKernels>),
    kv: &mut KvCacheManager<FreeListPool>,
    cache: &mut KvCache<CpuKernels>,
) -> Result<Vec<Stream>, Box<dyn std::error::Error>> {
    let max_rows = o.rows.iter().copied().max().unwrap_or(1);
    let text = "fn main() { let x = vec![1, 2, 3]; println!(\"{x:?}\"); } ".repeat(o.context);
    let base: Vec<u32> = md
        .tokenizer
        .encode(&text, false)?
        .into_iter()
        .take(o.context)
        .collect();
    let mut tables = Vec::new();
    for s in 0..o.streams {
        let prompt: Vec<u32> = base
            .iter()
            .cycle()
            .skip(s)
            .take(base.len() + max_rows)
            .copied()
            .collect();
        let table = kv.allocate_slots(s as u64, 0, prompt.len())?.to_vec();
        let input = SeqInput {
            tokens: &prompt[..o.context],
            start_pos: 0,
            block_tables: &table,
            logits: LogitsRows::Last,
            adapter: None,
        };
        model.forward(kernels, &[input], cache)?;
        tables.push((prompt, table));
    }
    Ok(tables)
}

/// Per row count, each round's step time and its ratio to the same round's plain step.
type Timings = (Vec<Vec<f64>>, Vec<Vec<f64>>);

/// `o.rounds` rounds, each timing a step of every row count in a rotating order (the median of three).
fn measure(
    o: &Opts,
    mut step: impl FnMut(usize) -> Result<f64, Box<dyn std::error::Error>>,
) -> Result<Timings, Box<dyn std::error::Error>> {
    let rows = &o.rows;
    for &n in rows {
        step(n)?; // warm-up
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for round in 0..o.rounds {
        let mut this = vec![0.0; rows.len()];
        for i in (0..rows.len()).map(|i| (i + round) % rows.len()) {
            // Three steps each, their median: one step is a few milliseconds.
            let mut s = [step(rows[i])?, step(rows[i])?, step(rows[i])?];
            this[i] = median(&mut s);
        }
        let plain = rows.iter().position(|&n| n == 1).map(|i| this[i]);
        for i in 0..rows.len() {
            times[i].push(this[i]);
            if let Some(p) = plain {
                ratios[i].push(this[i] / p);
            }
        }
    }
    Ok((times, ratios))
}

/// The median with the min–max, as "m (lo–hi)" with `scale` applied.
fn spread(xs: &[f64], scale: f64) -> String {
    let lo = xs.iter().copied().fold(f64::MAX, f64::min) * scale;
    let hi = xs.iter().copied().fold(0.0, f64::max) * scale;
    format!("{:.2} ({lo:.2}–{hi:.2})", median(&mut xs.to_vec()) * scale)
}

fn print_table(rows: &[usize], (times, ratios): &Timings) {
    println!(
        "| rows a sequence | ms a step, median (min–max) | × the plain step, median (min–max) | × with every draft accepted |"
    );
    println!("|---|---|---|---|");
    for (i, &n) in rows.iter().enumerate() {
        let (ratio, best) = if ratios[i].is_empty() {
            (String::from("—"), String::from("—"))
        } else {
            let r = &ratios[i];
            (
                spread(r, 1.0),
                format!("{:.2}", n as f64 / median(&mut r.clone())),
            )
        };
        println!("| {n} | {} | {ratio} | {best} |", spread(&times[i], 1e3));
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = Opts::parse()?;
    let max_rows = o.rows.iter().copied().max().unwrap_or(1);
    let md = ModelDir::open(std::path::Path::new(&o.dir))?;
    let kernels = CpuKernels::new(o.threads);
    let model = Decoder::load(&kernels, md.config.clone(), &md.weights)?;
    let block = 16;
    let per_seq = (o.context + max_rows).div_ceil(block);
    let blocks = o.streams * per_seq + 1;
    let mut kv = KvCacheManager::new(FreeListPool::new(blocks), block);
    let mut cache = model.new_kv_cache_as(&kernels, blocks, block, o.kv_dtype);
    println!(
        "{} | {} | context {}, {} streams",
        kernels.describe(),
        o.dir,
        o.context,
        o.streams
    );
    let tables = fill(&o, &md, (&kernels, &model), &mut kv, &mut cache)?;
    let context = o.context;
    // One step of `n` positions per sequence at positions `context..context + n` (rewritten each time).
    let step = |n: usize| -> Result<f64, Box<dyn std::error::Error>> {
        let inputs: Vec<SeqInput<'_>> = tables
            .iter()
            .map(|(p, t)| SeqInput {
                tokens: &p[context..context + n],
                start_pos: context,
                block_tables: t,
                logits: LogitsRows::All,
                adapter: None,
            })
            .collect();
        let (t, c) = (Instant::now(), thread_cpu_seconds());
        let out = model.forward(&kernels, &inputs, &mut cache)?;
        let secs = if o.cpu_time {
            thread_cpu_seconds() - c
        } else {
            t.elapsed().as_secs_f64()
        };
        model.recycle(out);
        Ok(secs)
    };
    let timings = measure(&o, step)?;
    print_table(&o.rows, &timings);
    Ok(())
}
