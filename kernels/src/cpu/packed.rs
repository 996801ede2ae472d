//! f32/f16/bf16 weight matrices repacked for an outer-product matmul micro-kernel.
//!
//! Layout: the `n × k` matrix is cut into panels of [`NR`] consecutive output rows (the last one padded
//! with zeros); panel `p` stores, for each `i` in `0..k`, the 16 elements `w[16p..16p+16, i]`
//! contiguously. One step of the kernel loads two 8-lane vectors of a panel and multiplies them with one
//! broadcast activation per batch row, so every loaded weight feeds up to 6 rows' accumulators without
//! any horizontal reduction (the BLIS "6×16" shape for 16 AVX2 registers; Van Zee & van de Geijn,
//! "BLIS: A Framework for Rapidly Instantiating BLAS Functionality", TOMS 2015).
//!
//! Invariants: each output element `out[r, j]` is one chain `acc = x[r,0]·w[j,0]; acc = x[r,i]·w[j,i] + acc`
//! for `i = 1..k` in order (fused on AVX2, separate multiply and add on the portable ISA), then `+ bias[j]`.
//! The chain depends only on that element's inputs, never on the tile, the batch size or the thread
//! count, so a row's outputs are bit-identical alone or in any batch. Long `k` runs in pieces whose
//! partial sums are stored in the output and reloaded exactly, which continues the same chain.
//!
//! Memory: the packed copy is owned (the file map it came from can then be dropped); packing happens
//! once, at upload, in parallel.

use super::pool;
use super::simd::{Elem, Isa, Portable, Simd};
use crate::weight::{DType, HostWeight, WeightData};
use half::{bf16, f16};

/// Output rows per panel (two 8-lane vectors).
pub(crate) const NR: usize = 16;

/// Most rows a register tile covers (6 rows × 2 vectors = 12 accumulators).
const MR: usize = 6;

/// One cache line; the buffer is made of them so panels start 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Line(pub(super) [u8; 64]);

/// A float weight matrix in panel layout (see the module header).
pub struct Packed {
    dtype: DType,
    rows: usize,
    cols: usize,
    buf: Vec<Line>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({}x{} {})", self.rows, self.cols, self.dtype)
    }
}

fn elem_bytes(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 4,
        _ => 2,
    }
}

impl Packed {
    /// Repacks `w` when it is an f32/f16/bf16 matrix of at least [`NR`] rows; `None` otherwise
    /// (vectors, quantized formats), which keep their stored layout.
    pub fn pack(w: &HostWeight) -> Option<Packed> {
        let dtype = w.dtype();
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) || w.rows() < NR || w.cols() == 0 {
            return None;
        }
        let (rows, cols) = (w.rows(), w.cols());
        let eb = elem_bytes(dtype);
        let panel_bytes = cols * NR * eb;
        let total = rows.div_ceil(NR) * panel_bytes;
        let mut buf = vec![Line([0; 64]); total.div_ceil(64)];
        let dst = bytemuck_lines(&mut buf);
        match w.data() {
            WeightData::F32(d) => scatter(d, bytemuck::cast_slice_mut(&mut dst[..total]), rows, cols),
            WeightData::F16(d) => scatter(d, bytemuck::cast_slice_mut(&mut dst[..total]), rows, cols),
            WeightData::BF16(d) => scatter(d, bytemuck::cast_slice_mut(&mut dst[..total]), rows, cols),
            WeightData::Quant(..) => return None,
        }
        Some(Packed {
            dtype,
            rows,
            cols,
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

    /// The stored element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The first byte of the first panel (64-byte aligned).
    pub(super) fn base(&self) -> *const u8 {
        self.buf.as_ptr().cast()
    }

    fn bytes(&self) -> &[u8] {
        let len = self.buf.len() * 64;
        // SAFETY: `Line` is 64 plain bytes with no padding.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), len) }
    }

    /// Row `j` (an output row of the matrix, e.g. one token's embedding) widened to f32 into `out`.
    pub fn row_to_f32(&self, j: usize, out: &mut [f32]) {
        let eb = elem_bytes(self.dtype);
        let panel = &self.bytes()[(j / NR) * self.cols * NR * eb..];
        for (i, o) in out[..self.cols].iter_mut().enumerate() {
            let at = (i * NR + j % NR) * eb;
            let e = &panel[at..at + eb];
            *o = match self.dtype {
                DType::F32 => f32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                DType::BF16 => bf16::from_le_bytes([e[0], e[1]]).to_f32(),
                _ => f16::from_le_bytes([e[0], e[1]]).to_f32(),
            };
        }
    }
}

impl Packed {
    /// The matrix back in its stored (row-major) layout.
    pub fn to_host(&self) -> HostWeight {
        let eb = elem_bytes(self.dtype);
        let src = self.bytes();
        let mut bytes = vec![0u8; self.rows * self.cols * eb];
        for (j, row) in bytes.chunks_exact_mut(self.cols * eb).enumerate() {
            let panel = &src[(j / NR) * self.cols * NR * eb..];
            for (i, e) in row.chunks_exact_mut(eb).enumerate() {
                let at = (i * NR + j % NR) * eb;
                e.copy_from_slice(&panel[at..at + eb]);
            }
        }
        let len = bytes.len();
        HostWeight::new(
            std::sync::Arc::new(bytes),
            0,
            len,
            self.dtype,
            self.rows,
            self.cols,
        )
        .expect("a packed matrix unpacks to its own shape")
    }
}

/// Row-major `rows × cols` elements into panels (see the module header).
fn scatter<T: bytemuck::Pod + Send + Sync>(src: &[T], dst: &mut [T], rows: usize, cols: usize) {
    pool::for_each_chunk(dst, cols * NR, 1, |p, panel| {
        for j in 0..NR.min(rows - p * NR) {
            let row = &src[(p * NR + j) * cols..(p * NR + j + 1) * cols];
            for (i, e) in row.iter().enumerate() {
                panel[i * NR + j] = *e;
            }
        }
    });
}

fn bytemuck_lines(buf: &mut [Line]) -> &mut [u8] {
    let len = buf.len() * 64;
    // SAFETY: `Line` is 64 plain bytes with no padding; the borrow is carried over.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), len) }
}

/// Blocks of panels per thread in a product of many rows (at least).
const PER_THREAD: usize = 3;

/// Raw output pointer shared by the tasks; each writes a disjoint set of columns.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements and the borrow of `out` outlives the parallel loop.
unsafe impl Send for OutPtr {}
// SAFETY: a shared `&OutPtr` only yields copies of the address; each task writes and reads back (its
// partial sums) only the outputs of its own rows × panels, as above.
unsafe impl Sync for OutPtr {}

/// `out[r, j] = Σ_i x[r, i] · w[j, i] + bias[j]` for `r < rows`, `j < w.rows()`.
pub(crate) fn matmul(
    isa: Isa,
    x: &[f32],
    rows: usize,
    w: &Packed,
    bias: Option<WeightData<'_>>,
    out: &mut [f32],
) {
    let (k, n) = (w.cols, w.rows);
    assert!(
        x.len() >= rows * k && out.len() >= rows * n,
        "matmul shape mismatch"
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "bias length");
    }
    if rows == 0 {
        return;
    }
    let panels = n.div_ceil(NR);
    let panel_bytes = k * NR * elem_bytes(w.dtype);
    let threads = pool::threads();
    // Tasks: blocks of panels (few enough weights to stay in L2 while the row tiles stream past them)
    // times chunks of rows, enough of them to balance the threads. Few rows (decode) split the panels
    // evenly over the threads.
    let by_cache = (384 * 1024 / panel_bytes).max(1);
    let (blocks, row_chunk) = if rows < 8 {
        // An equal share per thread (never rounded up to whole tiles: 36 panels over 2 threads as 24 + 12
        // left one thread idle a third of the time), in L2-sized pieces for large matrices.
        let even = panels.div_ceil(threads);
        let pieces = even.div_ceil(by_cache.max(8));
        ((threads * pieces).min(panels), rows)
    } else {
        // L2-sized blocks, at least PER_THREAD per thread and a multiple of the thread count, so that
        // equal blocks keep the threads level (192 panels in blocks of 21 had left one thread with 4
        // blocks and a sliver against the other's 5: 150 against 181 GMAC/s at 16 rows).
        let blocks = panels
            .div_ceil(by_cache)
            .max(PER_THREAD * threads)
            .next_multiple_of(threads)
            .min(panels);
        let chunks = (4 * threads).div_ceil(blocks).min(rows.div_ceil(24));
        (blocks, rows.div_ceil(chunks).div_ceil(24) * 24)
    };
    let out_ptr = OutPtr(out.as_mut_ptr());
    // The bias widened once per product: read per output element through `WeightData::get` it had cost
    // a quarter of an encoder's time (every BERT projection has one).
    let bias_f32 = bias.map(|b| {
        let mut v = vec![0.0f32; n];
        b.copy_to_f32(0, &mut v);
        v
    });
    let job = Job {
        x,
        k,
        n,
        bias: bias_f32.as_deref(),
        w,
    };
    pool::for_each(blocks * rows.div_ceil(row_chunk), |t| {
        let (b, c) = (t % blocks, t / blocks);
        // Blocks split the panels in proportion: their sizes differ by at most one panel.
        let ps = (b * panels / blocks, (b + 1) * panels / blocks);
        let rs = (c * row_chunk, ((c + 1) * row_chunk).min(rows));
        // SAFETY: shapes checked above; the outputs of rows `rs` × panels `ps` belong to this task.
        unsafe { run(isa, &job, Part { rs, ps }, out_ptr) }
    });
}

/// The share of one task: rows `rs.0..rs.1` against panels `ps.0..ps.1`.
#[derive(Clone, Copy)]
pub(super) struct Part {
    pub(super) rs: (usize, usize),
    pub(super) ps: (usize, usize),
}

/// Pieces of `k` run one after another for every tile, so the activations of a row tile and the piece of
/// each panel stay in L1; the accumulators carry over through `out` (stored and reloaded exactly, so
/// the chain per output is unchanged).
pub(super) fn k_pieces(k: usize) -> impl Iterator<Item = (usize, usize)> {
    let pieces = k.div_ceil(512);
    let len = k.div_ceil(pieces);
    (0..pieces).map(move |i| (i * len, ((i + 1) * len).min(k)))
}

/// One product, shared by its tasks.
pub(super) struct Job<'a> {
    pub(super) x: &'a [f32],
    pub(super) k: usize,
    n: usize,
    bias: Option<&'a [f32]>,
    pub(super) w: &'a Packed,
}

impl Job<'_> {
    /// Writes one panel row of results, `lanes[j]` being column `c0 + j` of row `r`, dropping the
    /// padding columns past `n`; adds the bias when `last` (the final piece of `k`), else stores the
    /// partial sums for [`Job::get`].
    ///
    /// # Safety
    /// `r < rows`, and the columns belong to the calling task.
    #[inline(always)]
    pub(super) unsafe fn put(&self, out: OutPtr, r: usize, c0: usize, lanes: &[f32; NR], last: bool) {
        let o = out.0.wrapping_add(r * self.n);
        for (j, l) in lanes.iter().enumerate().take(self.n.saturating_sub(c0).min(NR)) {
            let b = match (last, self.bias) {
                (true, Some(b)) => b[c0 + j],
                _ => 0.0,
            };
            // SAFETY: in bounds by the caller's contract (`r < rows`, `c0 + j < n`).
            unsafe { *o.add(c0 + j) = if last { l + b } else { *l } };
        }
    }

    /// The partial sums [`Job::put`] stored for row `r`, columns `c0..c0 + 16` (zero past `n`).
    ///
    /// # Safety
    /// As for [`Job::put`].
    #[inline(always)]
    pub(super) unsafe fn get(&self, out: OutPtr, r: usize, c0: usize) -> [f32; NR] {
        let o = out.0.wrapping_add(r * self.n);
        let mut lanes = [0.0f32; NR];
        for (j, l) in lanes
            .iter_mut()
            .enumerate()
            .take(self.n.saturating_sub(c0).min(NR))
        {
            // SAFETY: in bounds by the caller's contract.
            *l = unsafe { *o.add(c0 + j) };
        }
        lanes
    }
}

/// One task's share with the widest tiles of `isa`.
///
/// # Safety
/// This CPU has `isa`'s extensions (`Isa`'s invariant); `job.x` holds `rows · k` values, `out` points to
/// the `rows · n` outputs, and rows `ps.rs` (`ps.rs.1 ≤ rows`) × panels `ps.ps` (`ps.ps.1 ≤ ⌈n / 16⌉`)
/// of them are the calling task's alone.
unsafe fn run(isa: Isa, job: &Job<'_>, ps: Part, out: OutPtr) {
    match isa {
        // SAFETY: `Isa::Avx2` is only held where AVX2, FMA and F16C were found (our contract), which
        // is what `run_avx2` enables; the share is passed on under our contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { run_avx2(job, ps, out) },
        // SAFETY: `Isa::Avx512` is only held where AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C were found
        // (our contract), which covers `packed_avx512::run`'s `# Safety`; the share is passed on too.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { super::packed_avx512::run(job, ps, out) },
        // SAFETY: the portable lanes need no CPU extension; the share is passed on under our contract.
        _ => unsafe { run_generic::<Portable>(job, ps, out) },
    }
}

/// # Safety
/// AVX2, FMA and F16C must be available; otherwise as for [`run`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2(job: &Job<'_>, ps: Part, out: OutPtr) {
    // SAFETY: `Avx2` needs AVX2/FMA/F16C, enabled here and guaranteed by our caller (`# Safety`); the
    // rest of `run_generic`'s contract is ours.
    unsafe { run_generic::<super::simd::Avx2>(job, ps, out) }
}

/// # Safety
/// `S`'s instruction set is available; otherwise as for [`run`].
#[inline(always)]
unsafe fn run_generic<S: Simd>(job: &Job<'_>, ps: Part, out: OutPtr) {
    let base = job.w.base();
    // SAFETY: `base` is `job.w`'s panel buffer: `⌈n / 16⌉ · k · 16` elements of `job.w.dtype` (only
    // f32, bf16 and f16 are ever packed), read as that element type in each arm; the share and `S` are
    // as `block` requires (our contract).
    unsafe {
        match job.w.dtype {
            DType::F32 => block::<Lanes<S, f32>>(job, base.cast(), ps, out),
            DType::BF16 => block::<Lanes<S, bf16>>(job, base.cast(), ps, out),
            _ => block::<Lanes<S, f16>>(job, base.cast(), ps, out),
        }
    }
}

/// Where one tile reads and writes.
#[derive(Clone, Copy)]
pub(super) struct At {
    /// First row of the tile.
    pub(super) r: usize,
    /// First panel of the tile.
    pub(super) p: usize,
    /// The piece of `k` this pass covers.
    pub(super) ks: (usize, usize),
}

/// One instruction set's register tiles over panels of `Self::W` elements.
pub(super) trait Tiles {
    /// The stored weight element.
    type W;
    /// `R` rows against `P` panels (`R × 16P` outputs), each output one fixed-order chain over the
    /// piece `at.ks` of `k`.
    ///
    /// # Safety
    /// Rows `at.r..at.r + R` and panels `at.p..at.p + P` belong to the calling task (so they lie within
    /// `rows` and `⌈n / 16⌉`, and `job.x` holds those rows), `at.ks` lies within `0..k`, `w` is
    /// `job.w`'s panel buffer as `Self::W`, and the implementation's instruction set is available
    /// (AVX2/FMA/F16C for the AVX2 lanes, AVX-512F for `packed_avx512`'s).
    unsafe fn tile<const R: usize, const P: usize>(job: &Job<'_>, w: *const Self::W, at: At, out: OutPtr);
    /// Most rows of a tile.
    const MR: usize;
    /// Rows `at.r..at.r + rows` (`rows ≤ MR`) against panels `at.p..end`: [`row_tiles`] with the tile
    /// width this instruction set uses for that many rows.
    ///
    /// # Safety
    /// `1 ≤ rows ≤ MR`; as for [`Tiles::tile`] with rows `at.r..at.r + rows` and panels `at.p..end`.
    unsafe fn rows(job: &Job<'_>, w: *const Self::W, at: At, end: usize, out: OutPtr, rows: usize);
}

/// The 8-lane tiles (AVX2, portable): at most 6 rows × 1 panel (12 accumulators), and wide tiles
/// (≥ 8 independent accumulators) when few rows remain, as in decode.
struct Lanes<S, W>(std::marker::PhantomData<(S, W)>);

impl<S: Simd, W: Elem> Tiles for Lanes<S, W> {
    type W = W;
    const MR: usize = MR;

    #[inline(always)]
    unsafe fn tile<const R: usize, const P: usize>(job: &Job<'_>, w: *const W, at: At, out: OutPtr) {
        // SAFETY: `Tiles::tile`'s contract, which our caller upholds, is the free `tile`'s, `S` being
        // this implementation's instruction set.
        unsafe { tile::<S, W, R, P>(job, w, at, out) }
    }

    #[inline(always)]
    unsafe fn rows(job: &Job<'_>, w: *const W, at: At, end: usize, out: OutPtr, rows: usize) {
        // SAFETY: `1 ≤ rows ≤ MR = 6` (our contract), so each arm's `R` is exactly `rows` (the `_` arm
        // is `rows == 1`), and the rows and panels are the caller's: `row_tiles`' contract.
        unsafe {
            match rows {
                6 => row_tiles::<Self, 6, 1>(job, w, at, end, out),
                5 => row_tiles::<Self, 5, 1>(job, w, at, end, out),
                4 => row_tiles::<Self, 4, 1>(job, w, at, end, out),
                3 => row_tiles::<Self, 3, 2>(job, w, at, end, out),
                2 => row_tiles::<Self, 2, 3>(job, w, at, end, out),
                _ => row_tiles::<Self, 1, 4>(job, w, at, end, out),
            }
        }
    }
}

/// One task's rows and panels with the tiles of `T`, `k` piece by piece.
///
/// # Safety
/// Rows `part.rs` (within `rows`, held by `job.x`) and panels `part.ps` (within `⌈n / 16⌉`) belong to
/// the calling task, `w` is `job.w`'s panel buffer as `T::W`, and `T`'s instruction set is available.
#[inline(always)]
pub(super) unsafe fn block<T: Tiles>(job: &Job<'_>, w: *const T::W, part: Part, out: OutPtr) {
    for ks in k_pieces(job.k) {
        let mut r = part.rs.0;
        while r < part.rs.1 {
            let rows = (part.rs.1 - r).min(T::MR);
            // SAFETY: rows `r..r + rows` and the task's panels are the caller's.
            unsafe { T::rows(job, w, At { r, p: part.ps.0, ks }, part.ps.1, out, rows) };
            r += rows;
        }
    }
}

/// Rows `at.r..at.r + R` against panels `at.p..end`: tiles `WIDE` panels wide, then 4, 2 and 1 wide for
/// the rest.
///
/// # Safety
/// As for [`Tiles::tile`], with rows `at.r..at.r + R` and panels `at.p..end`.
#[inline(always)]
pub(super) unsafe fn row_tiles<T: Tiles, const R: usize, const WIDE: usize>(
    job: &Job<'_>,
    w: *const T::W,
    at: At,
    end: usize,
    out: OutPtr,
) {
    let mut at = at;
    // SAFETY: each tile covers our rows `at.r..at.r + R` and panels `at.p..at.p + P` with
    // `at.p + P ≤ end` (the `while`/`if` conditions), so every call meets `Tiles::tile`'s contract
    // under ours.
    unsafe {
        while at.p + WIDE <= end {
            T::tile::<R, WIDE>(job, w, at, out);
            at.p += WIDE;
        }
        if WIDE > 4 && at.p + 4 <= end {
            T::tile::<R, 4>(job, w, at, out);
            at.p += 4;
        }
        if WIDE > 2 && at.p + 2 <= end {
            T::tile::<R, 2>(job, w, at, out);
            at.p += 2;
        }
        while at.p < end {
            T::tile::<R, 1>(job, w, at, out);
            at.p += 1;
        }
    }
}

/// `R` rows against `P` panels (`R × 16P` outputs), each output one fixed-order chain over `k`.
///
/// # Safety
/// As for [`Tiles::tile`], `S` being the instruction set.
#[inline(always)]
unsafe fn tile<S: Simd, W: Elem, const R: usize, const P: usize>(
    job: &Job<'_>,
    w: *const W,
    at: At,
    out: OutPtr,
) {
    let k = job.k;
    let stride = k * NR;
    // SAFETY: by our contract, `xs[i]` is row `at.r + i < rows` of `x`, read at `i < at.ks.1 ≤ k`;
    // `wp` is panel `at.p`, and each weight load reads the 16 elements `i·16..i·16 + 16` of panel
    // `at.p + p` (`p < P`, `i < k`), inside the buffer's `⌈n / 16⌉ · k · 16` elements; the prefetch
    // hint never faults; the other loads and stores are on the local 16-element `lanes` (at 0 and 8);
    // `get`/`put` touch rows `at.r + r` and panels `at.p + p` of this task; `S` is available.
    unsafe {
        let xs: [*const f32; R] = {
            let mut xs = [job.x.as_ptr(); R];
            for (i, p) in xs.iter_mut().enumerate() {
                *p = job.x.as_ptr().add((at.r + i) * k);
            }
            xs
        };
        let wp = w.add(at.p * stride);
        let mut acc = [[[S::zero(); 2]; P]; R];
        if at.ks.0 > 0 {
            for (r, row) in acc.iter_mut().enumerate() {
                for (p, v) in row.iter_mut().enumerate() {
                    let lanes = job.get(out, at.r + r, (at.p + p) * NR);
                    v[0] = S::load(lanes.as_ptr());
                    v[1] = S::load(lanes.as_ptr().add(8));
                }
            }
        }
        for i in at.ks.0..at.ks.1 {
            let mut wv = [[S::zero(); 2]; P];
            for (p, v) in wv.iter_mut().enumerate() {
                let e = wp.add(p * stride + i * NR);
                if R <= 3 {
                    // Few rows: bound by memory, so ask 1 KiB ahead in this panel.
                    S::prefetch(e.cast::<u8>().wrapping_add(1024));
                }
                v[0] = W::load::<S>(e);
                v[1] = W::load::<S>(e.add(8));
            }
            for r in 0..R {
                let b = S::splat(*xs[r].add(i));
                for p in 0..P {
                    acc[r][p][0] = S::mul_add(b, wv[p][0], acc[r][p][0]);
                    acc[r][p][1] = S::mul_add(b, wv[p][1], acc[r][p][1]);
                }
            }
        }
        let last = at.ks.1 == k;
        for (r, row) in acc.iter().enumerate() {
            for (p, v) in row.iter().enumerate() {
                let mut lanes = [0.0f32; NR];
                S::store(lanes.as_mut_ptr(), v[0]);
                S::store(lanes.as_mut_ptr().add(8), v[1]);
                job.put(out, at.r + r, (at.p + p) * NR, &lanes, last);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_data::lcg;

    fn isas() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        if Isa::detect().has_avx2() {
            v.push(Isa::Avx2);
        }
        if Isa::detect() == Isa::Avx512 {
            v.push(Isa::Avx512);
        }
        v
    }

    fn run(isa: Isa, x: &[f32], rows: usize, w: &Packed, bias: Option<&HostWeight>) -> Vec<f32> {
        let mut out = vec![f32::NAN; rows * w.rows()];
        matmul(isa, x, rows, w, bias.map(|b| b.data()), &mut out);
        out
    }

    #[test]
    fn matches_naive_for_all_dtypes_and_odd_shapes() {
        for &(rows, k, n) in &[
            (1, 8, 16),
            (3, 13, 17),
            (7, 64, 40),
            (9, 37, 33),
            (13, 200, 130),
            (2, 5, 300),
        ] {
            let x = lcg(1, rows * k);
            let bias = HostWeight::from_f32(&lcg(9, n), 1, n).unwrap();
            for dt in [DType::F32, DType::F16, DType::BF16] {
                let host = HostWeight::from_f32_as(&lcg(2, n * k), n, k, dt).unwrap();
                let w = Packed::pack(&host).unwrap();
                let mut rounded = vec![0.0; n * k];
                host.data().copy_to_f32(0, &mut rounded);
                for isa in isas() {
                    let out = run(isa, &x, rows, &w, Some(&bias));
                    for r in 0..rows {
                        for j in 0..n {
                            let want: f64 = (0..k)
                                .map(|i| x[r * k + i] as f64 * rounded[j * k + i] as f64)
                                .sum::<f64>()
                                + bias.data().get(j) as f64;
                            let got = out[r * n + j];
                            assert!(
                                (got as f64 - want).abs() < 1e-4,
                                "{isa:?} {dt} {rows}x{k}x{n} [{r},{j}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn rows_are_bit_identical_whatever_the_batch_threads_and_wide_isa() {
        for (k, dt) in [(131, DType::F32), (131, DType::F16), (1100, DType::F16)] {
            let n = 200;
            let xs = lcg(3, 19 * k);
            let w = Packed::pack(&HostWeight::from_f32_as(&lcg(4, n * k), n, k, dt).unwrap()).unwrap();
            for isa in isas() {
                let alone: Vec<Vec<f32>> = (0..19)
                    .map(|r| run(isa, &xs[r * k..(r + 1) * k], 1, &w, None))
                    .collect();
                for rows in [2, 3, 4, 5, 6, 7, 8, 9, 14, 19] {
                    for threads in [1, 3] {
                        let pool = pool::Pool::new(threads);
                        let out = pool.scope(|| run(isa, &xs, rows, &w, None));
                        for (r, a) in alone.iter().enumerate().take(rows) {
                            let got: Vec<u32> = out[r * n..(r + 1) * n].iter().map(|v| v.to_bits()).collect();
                            let want: Vec<u32> = a.iter().map(|v| v.to_bits()).collect();
                            assert_eq!(got, want, "{isa:?} {dt} row {r} of {rows} with {threads} threads");
                        }
                    }
                }
            }
            // The AVX2 and AVX-512 tiles run the same fused chain per output: identical bits.
            if Isa::detect() == Isa::Avx512 {
                let a = run(Isa::Avx2, &xs, 19, &w, None);
                let b = run(Isa::Avx512, &xs, 19, &w, None);
                assert_eq!(a, b, "{dt}: AVX2 and AVX-512 differ");
            }
        }
    }

    #[test]
    fn unpacks_and_reads_rows_back_exactly() {
        let (n, k) = (37, 11);
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let host = HostWeight::from_f32_as(&lcg(5, n * k), n, k, dt).unwrap();
            let w = Packed::pack(&host).unwrap();
            let (mut a, mut b) = (vec![0.0; n * k], vec![0.0; n * k]);
            host.data().copy_to_f32(0, &mut a);
            w.to_host().data().copy_to_f32(0, &mut b);
            assert_eq!(a, b, "{dt}");
            for j in [0, 15, 16, 36] {
                let mut row = vec![0.0; k];
                w.row_to_f32(j, &mut row);
                assert_eq!(row, a[j * k..(j + 1) * k], "{dt} row {j}");
            }
        }
        // Vectors, short matrices and quantized formats keep their stored layout.
        assert!(Packed::pack(&HostWeight::from_f32(&lcg(6, 64), 1, 64).unwrap()).is_none());
        assert!(Packed::pack(&HostWeight::from_f32(&lcg(6, 15 * 4), 15, 4).unwrap()).is_none());
        let q =
            HostWeight::from_f32_as(&lcg(6, 32 * 32), 32, 32, DType::Quant(crate::QuantKind::Q8_0)).unwrap();
        assert!(Packed::pack(&q).is_none());
    }
}
