//! Times one product `rows × k` by `n × k` weights (f16 and q8_0) with the CPU kernels, for a few row
//! counts: the per-row cost shows whether multi-row tiles amortise the weight reads.
//!
//! `cargo run --release -p modelfleet-kernels --example mm_bench -- [K N THREADS [COPIES]]` (COPIES
//! distinct weight matrices used in turn; enough of them to overflow the caches time products whose
//! weights stream from memory, as in decode)

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
    for dtype in [DType::F32, DType::F16, DType::Quant(QuantKind::Q8_0)] {
        // `copies` distinct matrices used in turn: more than fit in the caches measures products that
        // stream their weights from memory, as decode does.
        let ws: Vec<_> = (0..copies)
            .map(|_| kern.upload(&HostWeight::from_f32_as(&vals, n, k, dtype).unwrap()))
            .collect();
        for rows in [1usize, 4, 16, 64] {
            let x = vec![0.25f32; rows * k];
            let mut xb = kern.alloc(rows * k);
            xb.copy_from_slice(&x);
            let mut out = kern.alloc(rows * n);
            let iters = (4000 / rows).max(20);
            kern.scope(|| {
                for w in ws.iter().cycle().take(10) {
                    kern.matmul(&xb, rows, w, None, &mut out);
                }
            });
            let t = Instant::now();
            kern.scope(|| {
                for w in ws.iter().cycle().take(iters) {
                    kern.matmul(&xb, rows, w, None, &mut out);
                }
            });
            let per = t.elapsed().as_secs_f64() / iters as f64;
            println!(
                "{dtype} {rows:>3} rows: {:>8.1} µs per product, {:>6.1} µs per row, {:>5.1} GMAC/s",
                per * 1e6,
                per * 1e6 / rows as f64,
                (rows * k * n) as f64 / per / 1e9
            );
        }
    }
}
