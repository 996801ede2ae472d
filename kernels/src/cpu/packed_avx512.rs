//! The AVX-512 micro-kernels for [`super::packed`]: one 16-lane register holds a whole panel row, and
//! 32 registers allow tiles of up to 8 rows × 3 panels (24 accumulators). On cores with full-width
//! 512-bit FMA units (AMD Zen 5, Intel server cores) that is twice the multiply-adds per instruction of
//! the AVX2 tiles.
//!
//! Invariant: each output is the same fused chain over `k` as in the AVX2 kernel (`acc = fma(x, w, acc)`
//! for `i = 0..k` in order, from `acc = 0`, then `+ bias`), so the two ISAs agree to the bit and the
//! result depends on nothing but the element's own inputs.

use super::packed::{At, Job, NR, OutPtr, Part, Tiles, block, row_tiles};
use std::arch::x86_64::*;

/// Most rows per tile.
const MR: usize = 8;

/// How far ahead in a panel the tiles prefetch.
const PREFETCH_BYTES: usize = 2048;

/// Weight element types, 16 at a time, widened to f32.
trait Load16: Copy {
    /// Sixteen elements from `p` as f32 lanes.
    ///
    /// # Safety
    /// `p..p + 16` must be readable (any alignment) and AVX-512F available.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Load16 for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: 16 readable f32 at `p` and AVX-512F (`load16`'s contract); `loadu` needs no alignment.
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl Load16 for half::f16 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: 16 f16 at `p` are the 32 readable bytes the unaligned `_mm256_loadu_si256` reads
        // (`load16`'s contract); `_mm512_cvtph_ps` needs AVX-512F, which the contract gives.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
}

impl Load16 for half::bf16 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: 16 bf16 at `p` are the 32 readable bytes the unaligned `_mm256_loadu_si256` reads
        // (`load16`'s contract); the widening and shift need AVX-512F, which the contract gives.
        unsafe {
            let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))
        }
    }
}

/// Panels `ps` of `job` (all rows) with AVX-512.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2, FMA and F16C; `job` must be consistent, `out` large
/// enough and rows `ps.rs` × panels `ps.ps` the calling task's (as `packed::matmul` checks and splits).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn run(job: &Job<'_>, ps: Part, out: OutPtr) {
    let base = job.w.base();
    // SAFETY: `Zmm` needs AVX-512F, enabled here and guaranteed by our caller (`# Safety`); `base` is
    // `job.w`'s panel buffer of `job.w.dtype()` elements (only f32, bf16 and f16 are ever packed), read
    // as that type in each arm; the share is `block`'s requirement, passed on from ours.
    unsafe {
        match job.w.dtype() {
            crate::DType::F32 => block::<Zmm<f32>>(job, base.cast(), ps, out),
            crate::DType::BF16 => block::<Zmm<half::bf16>>(job, base.cast(), ps, out),
            _ => block::<Zmm<half::f16>>(job, base.cast(), ps, out),
        }
    }
}

/// The 16-lane tiles: up to 8 rows × 3 panels (24 accumulators), wider when few rows remain.
struct Zmm<W>(std::marker::PhantomData<W>);

impl<W: Load16> Tiles for Zmm<W> {
    type W = W;
    const MR: usize = MR;

    #[inline(always)]
    unsafe fn tile<const R: usize, const P: usize>(job: &Job<'_>, w: *const W, at: At, out: OutPtr) {
        // SAFETY: `Tiles::tile`'s contract, which our caller upholds, is the free `tile`'s (AVX-512F
        // being this implementation's instruction set).
        unsafe { tile::<W, R, P>(job, w, at, out) }
    }

    #[inline(always)]
    unsafe fn rows(job: &Job<'_>, w: *const W, at: At, end: usize, out: OutPtr, rows: usize) {
        // SAFETY: `1 ≤ rows ≤ MR = 8` (our contract), so each arm's `R` is exactly `rows` (the `_` arm
        // is `rows == 1`), and the rows and panels are the caller's: `row_tiles`' contract.
        unsafe {
            match rows {
                8 => row_tiles::<Self, 8, 3>(job, w, at, end, out),
                7 => row_tiles::<Self, 7, 3>(job, w, at, end, out),
                6 => row_tiles::<Self, 6, 4>(job, w, at, end, out),
                5 => row_tiles::<Self, 5, 4>(job, w, at, end, out),
                4 => row_tiles::<Self, 4, 4>(job, w, at, end, out),
                3 => row_tiles::<Self, 3, 6>(job, w, at, end, out),
                2 => row_tiles::<Self, 2, 8>(job, w, at, end, out),
                _ => row_tiles::<Self, 1, 8>(job, w, at, end, out),
            }
        }
    }
}

/// `R` rows against `P` panels, one 16-lane register per panel row.
///
/// # Safety
/// As for [`Tiles::tile`], AVX-512F being the instruction set.
#[inline(always)]
unsafe fn tile<W: Load16, const R: usize, const P: usize>(job: &Job<'_>, w: *const W, at: At, out: OutPtr) {
    let k = job.k;
    let stride = k * NR;
    // SAFETY: by our contract, `xs[i]` is row `at.r + i < rows` of `x`, read at `i < at.ks.1 ≤ k`;
    // `wp` is panel `at.p`, and each `load16` reads the 16 elements `i·16..i·16 + 16` of panel
    // `at.p + p` (`p < P`, `i < k`), inside the buffer's `⌈n / 16⌉ · k · 16` elements; the prefetch is
    // a hint that never faults (its address is formed with `wrapping_add`); the other load and store
    // use the local 16-element `lanes`; `get`/`put` touch rows `at.r + r` and panels `at.p + p` of this
    // task; AVX-512F is available.
    unsafe {
        let mut xs = [job.x.as_ptr(); R];
        for (i, p) in xs.iter_mut().enumerate() {
            *p = job.x.as_ptr().add((at.r + i) * k);
        }
        let wp = w.add(at.p * stride);
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        if at.ks.0 > 0 {
            for (r, row) in acc.iter_mut().enumerate() {
                for (p, v) in row.iter_mut().enumerate() {
                    let lanes = job.get(out, at.r + r, (at.p + p) * NR);
                    *v = _mm512_loadu_ps(lanes.as_ptr());
                }
            }
        }
        for i in at.ks.0..at.ks.1 {
            let mut wv = [_mm512_setzero_ps(); P];
            for (p, v) in wv.iter_mut().enumerate() {
                let e = wp.add(p * stride + i * NR);
                // Ask 2 KiB ahead in this panel (a hint, which never faults, even past the end): the
                // first row tile over a panel streams it from memory, and without the hint its loads
                // wait on memory instead of overlapping the multiply-adds (16-row decode products were
                // 30% slower; nearer distances hide too little of the latency).
                _mm_prefetch::<_MM_HINT_T0>(e.cast::<u8>().wrapping_add(PREFETCH_BYTES).cast());
                *v = W::load16(e);
            }
            for r in 0..R {
                let b = _mm512_set1_ps(*xs[r].add(i));
                for p in 0..P {
                    acc[r][p] = _mm512_fmadd_ps(b, wv[p], acc[r][p]);
                }
            }
        }
        let last = at.ks.1 == k;
        for (r, row) in acc.iter().enumerate() {
            for (p, v) in row.iter().enumerate() {
                let mut lanes = [0.0f32; NR];
                _mm512_storeu_ps(lanes.as_mut_ptr(), *v);
                job.put(out, at.r + r, (at.p + p) * NR, &lanes, last);
            }
        }
    }
}
