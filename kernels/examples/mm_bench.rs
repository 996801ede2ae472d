//! Times one product `rows × k` by `n × k` weights (f32, f16 and q8_0 unless `MM_DTYPES` names others:
//! `MM_DTYPES=q4_K,q6_K,q5_0`) with the CPU kernels, for a few row counts: the per-row cost shows
//! whether multi-row tiles amortise the weight reads.
//!
//! `MM_ROWS=1,2,5,9` times those row counts instead of 1, 4, 16 and 64 (a speculative verification
//! step multiplies 2–9 rows a sequence); `MM_ROUNDS=20` splits the timing into rounds that alternate
//! the row counts and prints each count's median (min–max) over them and its ratio to the first count;
//! `CPU_TIME=1` times the calling thread's CPU time instead of the wall clock (with THREADS 1).
//!
//! `cargo run --release -p modelfleet-kernels --example mm_bench -- [K N THREADS [COPIES]]` (COPIES
//! distinct weight matrices used in turn; enough of them to overflow the caches time products whose
//! weights stream from memory, as in decode). Formats without a quantizer here (all quantized ones but
//! q8_0 and q4_0) get seeded random blocks with sane scales: the timing does not depend on the values.

use modelfleet_kernels::cpu::CpuKernels;
use modelfleet_kernels::{DType, HostWeight, Kernels, QuantKind};
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (k, n, threads) = (
        args.first().copied().unwrap_or(576),
        args.get(1).copied().unwrap_or(1536),
        args.get(2).copied().unwrap_or(2),
    );
    let copies = args.get(3).copied().unwrap_or(1).max(1);
    let kern = CpuKernels::new(threads);
    let vals: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919 % 1000) as f32 / 1000.0) - 0.5)
        .collect();
    let row_counts: Vec<usize> = std::env::var("MM_ROWS")
        .unwrap_or_else(|_| "1,4,16,64".into())
        .split(',')
        .filter_map(|r| r.parse().ok())
        .collect();
    let cpu_time = std::env::var_os("CPU_TIME").is_some();
    let rounds: usize = std::env::var("MM_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1)
        .max(1);
    let names = std::env::var("MM_DTYPES").unwrap_or_else(|_| "f32,f16,q8_0".into());
    for name in names.split(',') {
        let dtype = parse_dtype(name);
        // `copies` distinct matrices used in turn: more than fit in the caches measures products that
        // stream their weights from memory, as decode does.
        let ws: Vec<_> = (0..copies)
            .map(|_| kern.upload(&weight(&vals, n, k, dtype)))
            .collect();
        let mut bufs: Vec<_> = row_counts
            .iter()
            .map(|&rows| {
                let mut xb = kern.alloc(rows * k);
                xb.copy_from_slice(&vec![0.25f32; rows * k]);
                (xb, kern.alloc(rows * n))
            })
            .collect();
        // Rounds in which every row count takes its turn: a drift of the machine's speed reaches all
        // of them alike, and each round's time of r rows is also divided by that round's first count.
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); row_counts.len()];
        for round in 0..=rounds {
            for (i, &rows) in row_counts.iter().enumerate() {
                let (xb, out) = &mut bufs[i];
                let iters = (4000 / rows / rounds).max(4);
                let (t, c) = (Instant::now(), thread_cpu_seconds());
                kern.scope(|| {
                    for w in ws.iter().cycle().take(iters) {
                        kern.matmul(xb, rows, w, None, out);
                    }
                });
                let secs = if cpu_time {
                    thread_cpu_seconds() - c
                } else {
                    t.elapsed().as_secs_f64()
                };
                if round > 0 {
                    per[i].push(secs / iters as f64); // round 0 warms up
                }
            }
        }
        for (i, &rows) in row_counts.iter().enumerate() {
            let ratios: Vec<f64> = per[i].iter().zip(&per[0]).map(|(t, f)| t / f).collect();
            let t = median(&per[i]);
            println!(
                "{dtype} {rows:>3} rows: {:>8.1} µs per product ({:.1}–{:.1}), {:>6.1} µs per row, {:>5.1} \
                 GMAC/s, × {} rows {:.2} ({:.2}–{:.2})",
                t * 1e6,
                min(&per[i]) * 1e6,
                max(&per[i]) * 1e6,
                t * 1e6 / rows as f64,
                (rows * k * n) as f64 / t / 1e9,
                row_counts[0],
                median(&ratios),
                min(&ratios),
                max(&ratios),
            );
        }
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

fn min(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(0.0, f64::max)
}

/// A dtype by its GGML name.
fn parse_dtype(name: &str) -> DType {
    let q = match name {
        "f32" => return DType::F32,
        "f16" => return DType::F16,
        "bf16" => return DType::BF16,
        "q8_0" => QuantKind::Q8_0,
        "q4_0" => QuantKind::Q4_0,
        "q4_1" => QuantKind::Q4_1,
        "q5_0" => QuantKind::Q5_0,
        "q5_1" => QuantKind::Q5_1,
        "q4_K" => QuantKind::Q4K,
        "q6_K" => QuantKind::Q6K,
        other => panic!("MM_DTYPES: unknown dtype {other:?}"),
    };
    DType::Quant(q)
}

/// `vals` as an `n × k` matrix of `dtype`: quantized where a quantizer exists, else random blocks.
fn weight(vals: &[f32], n: usize, k: usize, dtype: DType) -> HostWeight {
    let q = match dtype {
        DType::Quant(q) if !matches!(q, QuantKind::Q8_0 | QuantKind::Q4_0) => q,
        _ => return HostWeight::from_f32_as(vals, n, k, dtype).unwrap(),
    };
    let (bb, count) = (q.block_bytes(), n * k / q.block_elems());
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut bytes: Vec<u8> = (0..bb * count)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect();
    // Finite f16 scales (and minimums) where each format keeps them.
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    let offsets: &[usize] = match q {
        QuantKind::Q6K => &[208],
        QuantKind::Q4_1 | QuantKind::Q5_1 | QuantKind::Q4K => &[0, 2],
        _ => &[0],
    };
    for blk in bytes.chunks_exact_mut(bb) {
        for &o in offsets {
            blk[o..o + 2].copy_from_slice(&scale);
        }
    }
    let len = bytes.len();
    HostWeight::new(std::sync::Arc::new(bytes), 0, len, dtype, n, k).unwrap()
}
