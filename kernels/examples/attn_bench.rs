//! Times paged attention for one sequence scoring `rows` consecutive positions at the end of a
//! `context`-token cache (a decode step: 1 row; a speculative verification step: 1 + k rows), with
//! SmolLM2-135M's heads (9 query heads, 3 KV heads of 64) unless told otherwise, an f16 cache, and
//! `LAYERS` distinct caches used in turn (30: a whole model's, which do not all fit in the caches, as
//! in a real step).
//!
//! `cargo run --release -p modelfleet-kernels --example attn_bench -- [CONTEXT THREADS [ROWS,ROWS,..]]`
//!
//! Rounds alternate the row counts; each count's median µs per call (min–max) and its ratio to the
//! first count, per round, are printed. `CPU_TIME=1` times the calling thread's CPU time instead of
//! the wall clock (with THREADS 1: the calls' own work, whatever else the machine runs).

use modelfleet_kernels::cpu::CpuKernels;
use modelfleet_kernels::{AttnHeads, AttnSeq, Kernels, KvDType, KvLayout};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let context: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(600);
    let threads: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let rows: Vec<usize> = args
        .get(2)
        .map_or("1,2,3,5,9", String::as_str)
        .split(',')
        .filter_map(|r| r.parse().ok())
        .collect();
    let layers: usize = std::env::var("LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let cpu_time = std::env::var_os("CPU_TIME").is_some();
    let kern = CpuKernels::new(threads);
    let heads = AttnHeads {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        scale: 0.125,
        window: None,
    };
    let block = 16;
    let max_rows = rows.iter().copied().max().unwrap_or(1);
    let num_blocks = (context + max_rows).div_ceil(block);
    let layout = KvLayout {
        num_blocks,
        block_size: block,
        num_kv_heads: 3,
        head_dim: 64,
        dtype: KvDType::F16,
    };
    let table: Vec<u32> = (0..num_blocks as u32).collect();
    // f16 values in 0.0..1.0 (two per f32 word of the backend buffer).
    let words = layout.storage_words();
    let caches: Vec<(Vec<f32>, Vec<f32>)> = (0..layers)
        .map(|l| {
            let fill = |salt: usize| -> Vec<f32> {
                (0..words)
                    .map(|i| {
                        let h = |j: usize| half::f16::from_f32(((j * 7919 + salt) % 997) as f32 / 997.0);
                        let (a, b) = (h(2 * i + l), h(2 * i + 1 + l));
                        f32::from_bits(u32::from(a.to_bits()) | (u32::from(b.to_bits()) << 16))
                    })
                    .collect()
            };
            (fill(1), fill(2))
        })
        .collect();
    let width = heads.num_heads * heads.head_dim;
    let q: Vec<f32> = (0..max_rows * width)
        .map(|i| ((i * 31) % 101) as f32 / 101.0 - 0.5)
        .collect();
    let mut out = vec![0.0f32; max_rows * width];
    let mut call = |n: usize, l: usize| {
        let seq = AttnSeq {
            row_start: 0,
            num_rows: n,
            first_pos: context - 1,
            block_table: &table,
        };
        kern.paged_attention(&q, &[seq], heads, &layout, (&caches[l].0, &caches[l].1), &mut out);
    };
    let rounds = 30;
    let mut per: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for round in 0..=rounds {
        for (i, &n) in rows.iter().enumerate() {
            let (t, c) = (Instant::now(), thread_cpu_seconds());
            kern.scope(|| (0..2 * layers).for_each(|j| call(n, j % layers)));
            let secs = if cpu_time {
                thread_cpu_seconds() - c
            } else {
                t.elapsed().as_secs_f64()
            };
            if round > 0 {
                per[i].push(secs / (2 * layers) as f64);
            }
        }
    }
    println!("{} | context {context}, {layers} caches", kern.describe());
    for (i, &n) in rows.iter().enumerate() {
        let ratios: Vec<f64> = per[i].iter().zip(&per[0]).map(|(t, f)| t / f).collect();
        println!(
            "{n:>2} rows: {:>7.1} µs per call ({:.1}–{:.1}), × {} rows {:.2} ({:.2}–{:.2})",
            median(&per[i]) * 1e6,
            fold(&per[i], f64::min) * 1e6,
            fold(&per[i], f64::max) * 1e6,
            rows[0],
            median(&ratios),
            fold(&ratios, f64::min),
            fold(&ratios, f64::max),
        );
    }
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

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn fold(xs: &[f64], f: fn(f64, f64) -> f64) -> f64 {
    xs.iter().copied().reduce(f).unwrap_or(0.0)
}
