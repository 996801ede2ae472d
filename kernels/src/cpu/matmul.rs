//! `out = x · Wᵀ (+ bias)` for weights in their stored layout (float matrices of 16 rows or more are
//! repacked at upload and go through [`super::packed`] instead): every weight applied to the whole batch
//! in one matrix-matrix product, multi-threaded over blocks of output columns. Quantized weights take
//! the integer paths (activations quantized to 8 bits per block of 32, as ggml does): `super::qdot`
//! with AVX2, `super::qdot_avx512` with AVX-512 VNNI, for every format; small float
//! matrices are read in place; quantized formats on the portable ISA are dequantized a few rows at a
//! time into f32 scratch rows.
//!
//! Invariants: each output element is one dot product over the full `k` in a fixed order — register
//! tiles of 4×2, 1×8, 1×4 and 1×1 outputs all perform the identical per-element operation sequence, and
//! the split into column blocks only decides which thread computes an element, never how. So a row's
//! outputs are bit-identical whatever the batch size or thread count (tested below). That is why this
//! is our own kernel rather than a library GEMM: `gemm`/BLAS pick blocking and k-splitting by problem
//! size, which changes a row's rounding with the batch.
//!
//! Design: dot-product micro-kernels as in llama.cpp's `ggml_vec_dot`, with register tiles over several
//! rows so prefill reuses each loaded weight row 4 times; column blocks sized so one block of weights
//! stays in L2 while all row tiles stream past it, the first pass prefetching the next tile's rows.

use super::pool;
use super::qdot::{Q8Block, dot_tile, quantize_rows};
use super::simd::{Elem, Isa, Portable, Simd};
use crate::quant::QuantKind;
use crate::weight::WeightData;

/// Raw output pointer shared by the column-block tasks; each task writes a disjoint set of columns.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);
// SAFETY: tasks write disjoint elements (distinct columns) and the borrow of `out` outlives the scope.
unsafe impl Send for OutPtr {}
// SAFETY: a shared `&OutPtr` only yields copies of the address; every write through one is to the
// writing task's own columns, as above, and nothing reads `out` during the loop.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The element at `i` (a method, so closures capture the whole `OutPtr`, which is `Sync`).
    pub(super) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }

    /// Stores a panel tile's sums plus the bias: `acc[i][q]` is row `r + i`, columns `(p + q)·16 ..+ 16`
    /// for `q < np`, those past `n` dropped (the integer and bf16 panels' common epilogue).
    ///
    /// # Safety
    /// `out` holds at least `(r + acc.len()) · n` values, and rows `r..r + acc.len()` × panels
    /// `p..p + np` of them belong to the caller, which nothing else touches meanwhile; `bias` holds `n`.
    pub(super) unsafe fn put_tile<const P: usize>(
        self,
        n: usize,
        r: usize,
        p: usize,
        acc: &[[[f32; 16]; P]],
        np: usize,
        bias: &[f32],
    ) {
        for (i, row) in acc.iter().enumerate() {
            for (q, lanes) in row[..np].iter().enumerate() {
                let c0 = (p + q) * 16;
                let m = 16.min(n - c0);
                // SAFETY: columns `c0..c0 + m` (`≤ n`) of row `r + i` are the caller's (our contract).
                let dst = unsafe { std::slice::from_raw_parts_mut(self.at((r + i) * n + c0), m) };
                for ((o, v), b) in dst.iter_mut().zip(lanes).zip(&bias[c0..c0 + m]) {
                    *o = v + b;
                }
            }
        }
    }
}

/// The shape of one product: `x` is `rows × k` row-major, the weight `n × k`, `out` `rows × n`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatmulShape {
    pub rows: usize,
    pub k: usize,
    pub n: usize,
}

/// Computes `out[r, j] = Σ_i x[r, i] · w[j, i] + bias[j]`.
pub(crate) fn matmul(
    isa: Isa,
    x: &[f32],
    w: WeightData<'_>,
    bias: Option<WeightData<'_>>,
    shape: MatmulShape,
    out: &mut [f32],
) {
    let MatmulShape { rows, k, n } = shape;
    assert!(
        x.len() >= rows * k && out.len() >= rows * n && w.len() == n * k,
        "matmul shape mismatch"
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "bias length");
    }
    if rows == 0 || n == 0 {
        return;
    }
    let row_bytes = match w {
        WeightData::F32(_) => 4 * k,
        WeightData::F16(_) | WeightData::BF16(_) => 2 * k,
        WeightData::Quant(q, _) => k / q.block_elems() * q.block_bytes(),
    };
    if let WeightData::Quant(q, bytes) = w
        && k.is_multiple_of(32)
        && super::qdot::supported(isa)
    {
        return matmul_q8(isa, q, bytes, x, bias, shape, out);
    }
    let threads = pool::threads();
    let by_cache = (256 * 1024 / row_bytes.max(1)).clamp(4, 256);
    let by_threads = n.div_ceil(4 * threads).max(4);
    let block = by_cache.min(by_threads).div_ceil(4) * 4;
    let out_ptr = OutPtr(out.as_mut_ptr());
    pool::for_each(n.div_ceil(block), |b| {
        let cols = (b * block, ((b + 1) * block).min(n));
        let job = Job {
            x,
            rows,
            k,
            n,
            cols,
            bias,
            out: out_ptr,
        };
        // SAFETY: shapes were checked above; columns `cols` are written by this task only.
        unsafe { run_block(isa, &job, w) }
    });
}

/// Q8_0/Q4_0/Q4_1 weights on AVX2: every row of `x` quantized once to 8-bit blocks, then integer dot
/// products (`super::qdot`), in tiles of up to 4 rows per weight row, over column blocks in parallel.
fn matmul_q8(
    isa: Isa,
    q: QuantKind,
    w: &[u8],
    x: &[f32],
    bias: Option<WeightData<'_>>,
    shape: MatmulShape,
    out: &mut [f32],
) {
    let MatmulShape { rows, k, n } = shape;
    let row_bytes = k / q.block_elems() * q.block_bytes();
    let xq = quantize_rows(x, rows, k);
    let nb = k / 32;
    let wide = isa == Isa::Avx512;
    let threads = pool::threads();
    let by_cache = (256 * 1024 / row_bytes.max(1)).clamp(4, 256);
    let block = by_cache.min(n.div_ceil(4 * threads).max(4));
    let out_ptr = OutPtr(out.as_mut_ptr());
    // Tiles of up to 4 rows × 4 weight rows with AVX-512 (4 × 2 with AVX2); a single row takes 1 × 2
    // with AVX-512, 1 × 1 with AVX2 (measured best with `examples/mm_bench`: 4 columns against 2 made
    // 16- and 64-row q8_0 products 10-20% faster).
    pool::for_each(n.div_ceil(block), |b| {
        let (c0, c1) = (b * block, ((b + 1) * block).min(n));
        let mut dots = [[0.0f32; 4]; 4];
        let wrow = |c: usize| &w[c * row_bytes..(c + 1) * row_bytes];
        let mut r = 0;
        while r < rows {
            let tile = (rows - r).min(4);
            let xs: [&[Q8Block]; 4] =
                std::array::from_fn(|i| &xq[(r + i.min(tile - 1)) * nb..(r + i.min(tile - 1) + 1) * nb]);
            let max_cols = match (wide, tile) {
                (true, 1) => 2,
                (_, 1) => 1,
                (true, _) => 4,
                _ => 2,
            };
            let mut c = c0;
            while c < c1 {
                let cols = (c1 - c).min(max_cols);
                let ws: [&[u8]; 4] = std::array::from_fn(|j| wrow(c + j.min(cols - 1)));
                if r == 0 {
                    // The next tile's weight rows, fetched while this one computes (the hardware
                    // prefetcher alone leaves multi-row tiles waiting on memory); later row tiles find
                    // this block's weights in L2.
                    let ahead = (c + cols)..(c + 2 * cols).min(c1);
                    prefetch(&w[ahead.start * row_bytes..ahead.end * row_bytes]);
                }
                tile_dots(wide, q, &ws[..cols], &xs[..tile], &mut dots);
                for (i, row) in dots[..tile].iter().enumerate() {
                    for (j, d) in row[..cols].iter().enumerate() {
                        let bc = bias.map_or(0.0, |bv| bv.get(c + j));
                        // SAFETY: column `c + j` belongs to this task; `r + i < rows`.
                        unsafe { *out_ptr.at((r + i) * n + c + j) = d + bc };
                    }
                }
                c += cols;
            }
            r += tile;
        }
    });
}

/// Asks for `bytes` to be brought into the cache (a hint; no effect off x86-64).
#[inline(always)]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch never faults; the address lies within `bytes`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast())
        };
    }
}

/// One integer tile: AVX-512 VNNI when `wide` (the ISA has it), else AVX2 (at most 4 rows × 2 columns).
fn tile_dots(wide: bool, q: QuantKind, ws: &[&[u8]], xs: &[&[Q8Block]], out: &mut [[f32; 4]; 4]) {
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: `wide` is `Isa::Avx512`, only detected with AVX-512 F/BW/VL/VNNI; shapes come from
        // `matmul_q8`, whose rows hold `k / 32` units of 32 values.
        return unsafe { super::qdot_avx512::dot_tile(q, ws, xs, out) };
    }
    let mut two = [[0.0f32; 2]; 4];
    dot_tile(q, ws, xs, &mut two);
    for (o, t) in out.iter_mut().zip(&two) {
        o[..2].copy_from_slice(t);
    }
}

/// One task: all rows for the columns `cols.0..cols.1`.
#[derive(Clone, Copy)]
struct Job<'a> {
    x: &'a [f32],
    rows: usize,
    k: usize,
    n: usize,
    cols: (usize, usize),
    bias: Option<WeightData<'a>>,
    out: OutPtr,
}

/// One task's columns with the widest lanes of `isa`.
///
/// # Safety
/// This CPU has `isa`'s extensions (`Isa`'s invariant); `w` has `job.n · job.k` elements
/// ([`WeightData::len`]) and `job` meets the rest of [`block`]'s contract.
unsafe fn run_block(isa: Isa, job: &Job<'_>, w: WeightData<'_>) {
    match isa {
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only held where AVX2, FMA and F16C were found (our
        // contract), which is what `run_block_avx2` enables; the job is passed on under our contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => unsafe { run_block_avx2(job, w) },
        // SAFETY: the portable lanes need no CPU extension; the job is passed on under our contract.
        _ => unsafe { run_block_generic::<Portable>(job, w) },
    }
}

/// # Safety
/// AVX2, FMA and F16C must be available; otherwise as for [`run_block`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_block_avx2(job: &Job<'_>, w: WeightData<'_>) {
    // SAFETY: `Avx2` needs AVX2/FMA/F16C, enabled here and guaranteed by our caller (`# Safety`); the
    // rest of `run_block_generic`'s contract is ours.
    unsafe { run_block_generic::<super::simd::Avx2>(job, w) }
}

/// # Safety
/// `S`'s instruction set is available; otherwise as for [`run_block`].
#[inline(always)]
unsafe fn run_block_generic<S: Simd>(job: &Job<'_>, w: WeightData<'_>) {
    // SAFETY: the float slices are `w`'s elements, `n · k` of them (our contract; `matmul` asserts
    // `w.len() == n · k`), which is `block`'s requirement on its weights since `cols.1 ≤ n`;
    // `block_quant` takes the same job and slices its quantized rows with checked indexing; `S` is
    // available (our contract).
    unsafe {
        match w {
            WeightData::F32(d) => block::<S, f32>(job, d),
            WeightData::F16(d) => block::<S, half::f16>(job, d),
            WeightData::BF16(d) => block::<S, half::bf16>(job, d),
            WeightData::Quant(q, b) => block_quant::<S>(job, q, b),
        }
    }
}

/// All rows of `job` for its columns `cols`, `w` being the weight rows in their stored element type.
///
/// # Safety
/// `S`'s instruction set is available; `job.x` holds at least `job.rows · job.k` values and `w` at
/// least `job.cols.1 · job.k` elements; for every `r < job.rows` and `c` in `job.cols.0..job.cols.1`,
/// `job.out + r · job.n + c` is a writable f32 of one output buffer that no other thread accesses
/// meanwhile.
#[inline(always)]
unsafe fn block<S: Simd, W: Elem>(job: &Job<'_>, w: &[W]) {
    let (c0, c1) = job.cols;
    let k = job.k;
    // SAFETY: every call below has `r < job.rows`, and `x` holds `rows · k` values (our contract), so
    // the offset `r · k` stays inside `x`.
    let xp = |r: usize| unsafe { job.x.as_ptr().add(r * k) };
    // SAFETY: every call below has `c < c1` and `w` holds `c1 · k` elements (our contract), so the
    // offset `c · k` stays inside `w`.
    let wp = |c: usize| unsafe { w.as_ptr().add(c * k) };
    let bias = |c: usize| job.bias.map_or(0.0, |b| b.get(c));
    // SAFETY: every call below has `r < rows` and `c0 ≤ c < c1`, for which our contract makes
    // `out + r · n + c` an output only this task accesses.
    let put = |r: usize, c: usize, v: f32| unsafe { *job.out.0.add(r * job.n + c) = v + bias(c) };
    let mut r = 0;
    // SAFETY: the tiles get rows `r..r + 4` only while `r + 4 ≤ rows` (else the single row `r < rows`)
    // and weight rows `c..c + C` only while `c + C ≤ c1` (loop conditions), each row `k` long and
    // inside `x` or `w` as above, which is `tile`'s requirement; `S` is available (our contract).
    unsafe {
        while r + 4 <= job.rows {
            let xs = [xp(r), xp(r + 1), xp(r + 2), xp(r + 3)];
            let mut c = c0;
            while c + 2 <= c1 {
                let t = tile::<S, W, 4, 2>(xs, [wp(c), wp(c + 1)], k);
                for (i, row) in t.iter().enumerate() {
                    put(r + i, c, row[0]);
                    put(r + i, c + 1, row[1]);
                }
                c += 2;
            }
            if c < c1 {
                let t = tile::<S, W, 4, 1>(xs, [wp(c)], k);
                for (i, row) in t.iter().enumerate() {
                    put(r + i, c, row[0]);
                }
            }
            r += 4;
        }
        while r < job.rows {
            let xs = [xp(r)];
            let mut c = c0;
            // Eight independent accumulators keep both FMA ports busy in the decode-sized case.
            while c + 8 <= c1 {
                let ws = [
                    wp(c),
                    wp(c + 1),
                    wp(c + 2),
                    wp(c + 3),
                    wp(c + 4),
                    wp(c + 5),
                    wp(c + 6),
                    wp(c + 7),
                ];
                let t = tile::<S, W, 1, 8>(xs, ws, k);
                for (j, v) in t[0].iter().enumerate() {
                    put(r, c + j, *v);
                }
                c += 8;
            }
            while c + 4 <= c1 {
                let t = tile::<S, W, 1, 4>(xs, [wp(c), wp(c + 1), wp(c + 2), wp(c + 3)], k);
                for (j, v) in t[0].iter().enumerate() {
                    put(r, c + j, *v);
                }
                c += 4;
            }
            while c < c1 {
                put(r, c, tile::<S, W, 1, 1>(xs, [wp(c)], k)[0][0]);
                c += 1;
            }
            r += 1;
        }
    }
}

/// Quantized weights: each group of up to 4 columns is dequantized once into an f32 scratch row, then
/// every row of `x` runs the f32 tiles against it. Each output is still one full-length dot product in
/// the fixed chunk order, so batch invariance holds here too.
///
/// # Safety
/// As for [`block`], `w` being the whole matrix's quantized bytes (its rows are sliced with checks).
#[inline(always)]
unsafe fn block_quant<S: Simd>(job: &Job<'_>, q: QuantKind, w: &[u8]) {
    let (c0, c1) = job.cols;
    let k = job.k;
    let row_bytes = k / q.block_elems() * q.block_bytes();
    let mut scratch = vec![0.0f32; 4 * k];
    let mut c = c0;
    while c < c1 {
        let group = (c1 - c).min(4);
        for g in 0..group {
            let src = &w[(c + g) * row_bytes..(c + g + 1) * row_bytes];
            crate::quant::dequantize_row(q, src, &mut scratch[g * k..(g + 1) * k]);
        }
        let sub = Job {
            cols: (0, group),
            n: job.n,
            // SAFETY: `c < c1`, so `out + c` is output `(0, c)`, one of ours (our contract, with
            // `rows ≥ 1`: `matmul` returns early when `rows == 0`).
            out: OutPtr(unsafe { job.out.0.add(c) }),
            bias: None,
            ..*job
        };
        // SAFETY: `sub`'s outputs `out + c + r · n + g` (`r < rows`, `g < group`) are our outputs
        // `(r, c + g)` with `c + group ≤ c1` (our contract); `scratch[..group · k]` holds exactly the
        // `group` weight rows it reads; `job.x` and `S` as in our contract.
        unsafe { block::<S, f32>(&sub, &scratch[..group * k]) };
        if let Some(b) = job.bias {
            for r in 0..job.rows {
                for g in 0..group {
                    // SAFETY: `r < rows` and `c + g < c1 ≤ n`: inside the outputs and in one of this
                    // task's columns (our contract).
                    unsafe { *job.out.0.add(r * job.n + c + g) += b.get(c + g) };
                }
            }
        }
        c += group;
    }
}

/// The `R × C` register tile: `R` rows of `x` against `C` weight rows, each a full-length dot product.
///
/// # Safety
/// `S`'s instruction set is available; every `x[r]` and `w[c]` points to `k` readable elements.
#[inline(always)]
unsafe fn tile<S: Simd, W: Elem, const R: usize, const C: usize>(
    x: [*const f32; R],
    w: [*const W; C],
    k: usize,
) -> [[f32; C]; R] {
    let k8 = k / 8 * 8;
    // SAFETY: the 8-lane loads read elements `i..i + 8` with `i + 8 ≤ k8 ≤ k` (loop condition, `k8`
    // being `k` rounded down to a multiple of 8) and the scalar tail elements `k8..k`, all within the
    // `k` readable elements of each row (our contract); the loads are unaligned and the scalar reads
    // come from pointers into `&[f32]`/`&[W]`, so aligned; `S` is available (our contract).
    unsafe {
        let mut acc = [[S::zero(); C]; R];
        let mut i = 0;
        while i < k8 {
            // A loop, not `array::from_fn`: closures do not inherit `#[target_feature]`.
            let mut xv = [S::zero(); R];
            for r in 0..R {
                xv[r] = S::load(x[r].add(i));
            }
            for c in 0..C {
                let wv = W::load::<S>(w[c].add(i));
                for r in 0..R {
                    acc[r][c] = S::mul_add(xv[r], wv, acc[r][c]);
                }
            }
            i += 8;
        }
        let mut out = [[0.0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                let mut tail = 0.0f32;
                for j in k8..k {
                    tail = S::scalar_mul_add(*x[r].add(j), (*w[c].add(j)).to_f32(), tail);
                }
                out[r][c] = S::hsum(acc[r][c]) + tail;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_data::lcg;
    use crate::weight::{DType, HostWeight};

    fn naive(x: &[f32], w: &[f32], rows: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0.0; rows * n];
        for r in 0..rows {
            for j in 0..n {
                out[r * n + j] = (0..k)
                    .map(|i| x[r * k + i] as f64 * w[j * k + i] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    fn isas() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        if Isa::detect() != Isa::Portable {
            v.push(Isa::detect());
        }
        v
    }

    #[test]
    fn matches_naive_for_all_dtypes_and_odd_shapes() {
        for isa in isas() {
            for &(rows, k, n) in &[(1, 8, 4), (3, 13, 7), (5, 64, 9), (9, 37, 33), (4, 200, 130)] {
                let x = lcg(1, rows * k);
                let wv = lcg(2, n * k);
                for dt in [DType::F32, DType::F16, DType::BF16] {
                    let w = HostWeight::from_f32_as(&wv, n, k, dt).unwrap();
                    let mut rounded = vec![0.0; n * k];
                    w.data().copy_to_f32(0, &mut rounded);
                    let mut out = vec![0.0; rows * n];
                    matmul(isa, &x, w.data(), None, MatmulShape { rows, k, n }, &mut out);
                    let want = naive(&x, &rounded, rows, k, n);
                    for (a, b) in out.iter().zip(&want) {
                        assert!((a - b).abs() < 1e-4, "{isa:?} {dt} {rows}x{k}x{n}: {a} vs {b}");
                    }
                }
            }
        }
    }

    #[test]
    fn quantized_weights_match_naive_and_are_batch_invariant() {
        use crate::quant::QuantKind;
        let n = 11;
        let b = HostWeight::from_f32(&lcg(6, n), 1, n).unwrap();
        for q in QuantKind::ALL {
            // Two blocks of the 256-value formats, three of the others.
            let k = if q.block_elems() == 256 { 512 } else { 96 };
            let x = lcg(5, 9 * k);
            let w = if matches!(q, QuantKind::Q8_0 | QuantKind::Q4_0) {
                HostWeight::from_f32_as(&lcg(7, n * k), n, k, DType::Quant(q)).unwrap()
            } else {
                let bytes = crate::quant::test_blocks::blocks(q, n * k / q.block_elems());
                let len = bytes.len();
                HostWeight::new(std::sync::Arc::new(bytes), 0, len, DType::Quant(q), n, k).unwrap()
            };
            let mut deq = vec![0.0; n * k];
            w.data().copy_to_f32(0, &mut deq);
            for isa in isas() {
                let mut out = vec![0.0; 9 * n];
                matmul(
                    isa,
                    &x,
                    w.data(),
                    Some(b.data()),
                    MatmulShape { rows: 9, k, n },
                    &mut out,
                );
                let want = naive(&x, &deq, 9, k, n);
                // The integer path (AVX2) rounds activations to 8 bits per block of 32, as ggml does:
                // allow 1% of the sum of |x·w| there; the f32 path is exact to rounding.
                let absx: Vec<f32> = x.iter().map(|v| v.abs()).collect();
                let absw: Vec<f32> = deq.iter().map(|v| v.abs()).collect();
                let scale = naive(&absx, &absw, 9, k, n);
                let int8 = super::super::qdot::supported(isa);
                for (i, (a, w)) in out.iter().zip(&want).enumerate() {
                    let tol = if int8 {
                        1e-4 + 0.01 * scale[i]
                    } else {
                        1e-4 + 1e-6 * scale[i]
                    };
                    assert!(
                        (a - (w + b.data().get(i % n))).abs() < tol,
                        "{q:?} {isa:?}: {a} vs {}",
                        w + b.data().get(i % n)
                    );
                }
                for r in 0..9 {
                    let mut one = vec![0.0; n];
                    let shape = MatmulShape { rows: 1, k, n };
                    matmul(
                        isa,
                        &x[r * k..(r + 1) * k],
                        w.data(),
                        Some(b.data()),
                        shape,
                        &mut one,
                    );
                    assert_eq!(one, out[r * n..(r + 1) * n], "{q:?} {isa:?} row {r}");
                }
            }
        }
    }

    #[test]
    fn bias_is_added() {
        let w = HostWeight::from_f32(&[1.0, 0.0, 0.0, 1.0], 2, 2).unwrap();
        let b = HostWeight::from_f32(&[10.0, 20.0], 1, 2).unwrap();
        let mut out = vec![0.0; 2];
        let shape = MatmulShape { rows: 1, k: 2, n: 2 };
        matmul(
            Isa::detect(),
            &[1.0, 2.0],
            w.data(),
            Some(b.data()),
            shape,
            &mut out,
        );
        assert_eq!(out, vec![11.0, 22.0]);
    }

    #[test]
    fn rows_are_bit_identical_whatever_the_batch_and_threads() {
        let (k, n) = (131, 75);
        let xs = lcg(3, 11 * k);
        let w = HostWeight::from_f32_as(&lcg(4, n * k), n, k, DType::F16).unwrap();
        for isa in isas() {
            let mut alone = vec![vec![0.0; n]; 11];
            for (r, a) in alone.iter_mut().enumerate() {
                matmul(
                    isa,
                    &xs[r * k..(r + 1) * k],
                    w.data(),
                    None,
                    MatmulShape { rows: 1, k, n },
                    a,
                );
            }
            for rows in [2, 4, 5, 11] {
                for threads in [1, 3] {
                    let pool = pool::Pool::new(threads);
                    let mut out = vec![0.0; rows * n];
                    pool.scope(|| matmul(isa, &xs, w.data(), None, MatmulShape { rows, k, n }, &mut out));
                    for r in 0..rows {
                        let got: Vec<u32> = out[r * n..(r + 1) * n].iter().map(|v| v.to_bits()).collect();
                        let want: Vec<u32> = alone[r].iter().map(|v| v.to_bits()).collect();
                        assert_eq!(got, want, "{isa:?} row {r} of {rows} with {threads} threads");
                    }
                }
            }
        }
    }
}
