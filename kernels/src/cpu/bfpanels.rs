//! f16/bf16 weight matrices as bf16 pair panels for the AVX-512 BF16 dot product (`vdpbf16ps`).
//!
//! Layout: panels of [`NR`] output rows (the last padded with zeros); panel `p` stores, for each pair
//! `t` of inputs (`k` padded to even), the 16 pairs `(w[16p + j, 2t], w[16p + j, 2t + 1])` as bf16, one
//! 64-byte line. The activations are rounded to bf16 once per product (round to nearest even); one
//! `vdpbf16ps` of a weight line against a broadcast activation pair adds two products to 16 outputs'
//! accumulators, 32 multiply-adds per instruction where an f32 FMA does 16 (on this project's AVX-512
//! BF16 host the two issue at the same rate: compute-bound products run at 1.8× the f32 tiles'
//! multiply-adds per second, docs/benchmarks.md).
//!
//! Exactness: this is not the f32 path. The weights are rounded to bf16 at load (exact for bf16
//! files; f16 keeps 8 of its 11 significant bits) and the activations to bf16 per product; products of
//! two bf16 are exact in f32 and the sums are f32. vLLM's CPU backend makes the same choice (f16 models
//! run in bf16 there); the cost is measured per format in docs/benchmarks.md ("bf16 dot products").
//! Used for f16 and bf16 matrices wherever the CPU has AVX-512 BF16 unless switched off ([`Bf16Dot`]:
//! `--bf16-dot off`), as the integer panels are for quantized ones; the f32 tiles ([`super::packed`])
//! stay the exact reference.
//!
//! Invariant: each output is one chain `acc = 0; acc = dpbf16(acc, x pair t, w pair t)` for `t = 0..`
//! in order, then `+ bias`: it depends on nothing but the element's own inputs, so a row gets the
//! same bits alone, in any batch, tile or thread count.

use super::matmul::OutPtr;
use super::packed::Line;
use super::pool;
use crate::weight::{DType, HostWeight, WeightData};
use half::bf16;

/// Output rows per panel: one 16-lane f32 register of accumulators.
pub(crate) const NR: usize = 16;

/// A f16/bf16 matrix in bf16 pair panels (see the module header).
pub struct BfPanels {
    rows: usize,
    cols: usize,
    /// Input pairs, `⌈cols / 2⌉`.
    pairs: usize,
    buf: Vec<Line>,
}

impl std::fmt::Debug for BfPanels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BfPanels({}x{})", self.rows, self.cols)
    }
}

/// Which float matrices [`super::CpuKernels`] on [`super::Isa::Avx512`] hold as [`BfPanels`] where the
/// CPU has AVX-512 BF16 (elsewhere every float matrix keeps the exact f32 tiles). The cost in accuracy
/// is measured in docs/benchmarks.md ("bf16 dot products").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Bf16Dot {
    /// None: every float matrix on the exact f32 tiles.
    Off,
    /// bf16 matrices: their weights are held exactly, only the activations are rounded (as llama.cpp
    /// does for its BF16 products).
    Bf16,
    /// f16 matrices too: their weights lose 3 of their 11 significant bits (the default).
    #[default]
    All,
}

impl Bf16Dot {
    /// From `MODELFLEET_BF16_DOT` (`off`, `bf16` or `all`; unset or anything else is `all`).
    pub fn from_env() -> Self {
        match std::env::var("MODELFLEET_BF16_DOT").as_deref() {
            Ok("off") => Bf16Dot::Off,
            Ok("bf16") => Bf16Dot::Bf16,
            _ => Bf16Dot::All,
        }
    }

    /// Whether a matrix of `dtype` goes to bf16 panels on this CPU.
    pub(crate) fn covers(self, dtype: DType) -> bool {
        let wanted = matches!(
            (self, dtype),
            (Bf16Dot::All, DType::F16 | DType::BF16) | (Bf16Dot::Bf16, DType::BF16)
        );
        wanted && supported()
    }
}

/// Whether this CPU has the extensions the tiles use.
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

impl BfPanels {
    /// Repacks `w` when it is an f16 or bf16 matrix of at least [`NR`] rows; `None` otherwise.
    pub fn pack(w: &HostWeight) -> Option<BfPanels> {
        if !matches!(w.dtype(), DType::F16 | DType::BF16) || w.rows() < NR || w.cols() == 0 {
            return None;
        }
        let (rows, cols) = (w.rows(), w.cols());
        let pairs = cols.div_ceil(2);
        let mut buf = vec![Line([0; 64]); rows.div_ceil(NR) * pairs];
        let data = w.data();
        pool::for_each_chunk(&mut buf, pairs, 1, |p, panel| {
            let mut row = vec![0.0f32; cols];
            for j in 0..NR.min(rows - p * NR) {
                data.copy_to_f32((p * NR + j) * cols, &mut row);
                for (i, v) in row.iter().enumerate() {
                    let at = 4 * j + 2 * (i % 2);
                    panel[i / 2].0[at..at + 2].copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
                }
            }
        });
        Some(BfPanels {
            rows,
            cols,
            pairs,
            buf,
        })
    }

    /// Output rows (`n`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns (`k`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Element `(j, i)` as the products use it.
    fn get(&self, j: usize, i: usize) -> bf16 {
        let line = &self.buf[(j / NR) * self.pairs + i / 2].0;
        let at = 4 * (j % NR) + 2 * (i % 2);
        bf16::from_le_bytes([line[at], line[at + 1]])
    }

    /// Row `j` (an output row, e.g. one token's embedding) as the products see it, widened to f32.
    pub fn row_to_f32(&self, j: usize, out: &mut [f32]) {
        for (i, o) in out[..self.cols].iter_mut().enumerate() {
            *o = self.get(j, i).to_f32();
        }
    }

    /// The matrix in row-major bf16: the values the products use (the stored f16 rounded).
    pub fn to_host(&self) -> HostWeight {
        let mut bytes = Vec::with_capacity(self.rows * self.cols * 2);
        for j in 0..self.rows {
            for i in 0..self.cols {
                bytes.extend_from_slice(&self.get(j, i).to_le_bytes());
            }
        }
        let len = bytes.len();
        HostWeight::new(
            std::sync::Arc::new(bytes),
            0,
            len,
            DType::BF16,
            self.rows,
            self.cols,
        )
        .expect("bf16 panels unpack to their own shape")
    }
}

/// `out[r, j] = Σ_i bf16(x[r, i]) · w[j, i] + bias[j]` for `r < rows`, `j < w.rows()`.
///
/// # Panics
/// If the shapes disagree or this CPU lacks the extensions ([`supported`]).
pub(crate) fn matmul(x: &[f32], rows: usize, w: &BfPanels, bias: Option<WeightData<'_>>, out: &mut [f32]) {
    let (k, n, pairs) = (w.cols, w.rows, w.pairs);
    assert!(
        x.len() >= rows * k && out.len() >= rows * n,
        "matmul shape mismatch"
    );
    assert!(supported(), "bf16 panels need AVX-512 BF16");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "bias length");
    }
    if rows == 0 {
        return;
    }
    // The activations as bf16 pairs, row by row (the odd tail padded with zero).
    let mut xb = vec![0u32; rows * pairs];
    pool::for_each_chunk(&mut xb, pairs, 1, |r, dst| {
        // SAFETY: `supported()` was asserted above; `dst` holds `⌈k / 2⌉` pairs for row `r`'s `k` values.
        unsafe { x86::to_bf16_pairs(&x[r * k..(r + 1) * k], dst) }
    });
    let panels = n.div_ceil(NR);
    let panel_bytes = pairs * 64;
    // Panels per task: a block of them stays in L2 while every row tile passes over it, and at least
    // four tasks per thread for balance.
    let by_cache = (256 * 1024 / panel_bytes).clamp(1, 64);
    let per_task = by_cache.min(panels.div_ceil(4 * pool::threads())).max(1);
    let mut bias_f32 = vec![0.0f32; n];
    if let Some(b) = bias {
        b.copy_to_f32(0, &mut bias_f32);
    }
    let (bias, xb, out_ptr) = (&bias_f32, &xb, OutPtr(out.as_mut_ptr()));
    let lines = &w.buf;
    pool::for_each(panels.div_ceil(per_task), |t| {
        let (p0, p1) = (t * per_task, ((t + 1) * per_task).min(panels));
        for (r, tile) in row_tiles(rows) {
            let step = x86::panels_for(tile);
            let mut p = p0;
            while p < p1 {
                let np = (p1 - p).min(step);
                let mut acc = [[[0.0f32; NR]; x86::MP]; x86::MR];
                let xs = &xb[r * pairs..(r + tile) * pairs];
                let ws = &lines[p * pairs..(p + np) * pairs];
                // SAFETY: `supported()` was asserted above; `xs` holds `tile` rows of `pairs` pairs and
                // `ws` `np ≤ panels_for(tile)` whole panels of `pairs` lines.
                unsafe { x86::tile(tile, np, pairs, xs, ws, &mut acc) };
                // SAFETY: rows `r..r + tile` (`≤ rows`) × panels `p..p + np` (`≤ panels`) are this
                // task's, and `out` holds `rows · n` values (checked above).
                unsafe { out_ptr.put_tile(n, r, p, &acc[..tile], np, bias) };
                p += np;
            }
        }
    });
}

/// The row tiles of a product of `rows` rows, as (first row, rows): tiles of `x86::MR` rows, but a
/// product of up to twice that in two near-equal tiles (a verification step of 9 rows is 5 + 4, not
/// 8 + 1: the one-row pass would cost nearly what the eight-row one does).
fn row_tiles(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let size = if rows > x86::MR && rows <= 2 * x86::MR {
        rows.div_ceil(2)
    } else {
        x86::MR
    };
    (0..rows.div_ceil(size)).map(move |t| (t * size, size.min(rows - t * size)))
}

#[cfg(target_arch = "x86_64")]
#[path = "bfpanels_x86.rs"]
mod x86;

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    pub(super) const MR: usize = 1;
    pub(super) const MP: usize = 1;
    pub(super) fn panels_for(_: usize) -> usize {
        1
    }
    pub(super) unsafe fn to_bf16_pairs(_: &[f32], _: &mut [u32]) {
        unreachable!("bf16 panels are only built on x86-64")
    }
    pub(super) unsafe fn tile(
        _: usize,
        _: usize,
        _: usize,
        _: &[u32],
        _: &[super::Line],
        _: &mut [[[f32; 16]; 1]; 1],
    ) {
        unreachable!("bf16 panels are only built on x86-64")
    }
}

#[cfg(test)]
#[path = "bfpanels_tests.rs"]
mod tests;
