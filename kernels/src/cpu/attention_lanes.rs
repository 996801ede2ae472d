//! The vector lanes paged attention (`super`) runs on — [`Lanes`]: 8 lanes of a [`Simd`]
//! implementation (portable or AVX2) or 16 AVX-512 lanes — and the cache elements it reads
//! ([`KvElem`]: f32, f16 or i8, widened exactly).
//!
//! Invariant: every operation is the same per lane whatever the width ([`Lanes::fma`] is fused
//! exactly when [`Lanes::scalar_fma`] is), so a chain computed on 8 or 16 lanes gives the same bits.

use super::simd::Simd;

/// The vector registers the kernel runs on: `W` f32 lanes.
///
/// # Safety
/// Every `unsafe fn` here needs the implementation's instruction set: `Eight<S>` that of `S` (see
/// [`Simd`]), [`Sixteen`] AVX-512F (the tiles run inside `run_avx512`). The pointer methods also need
/// the memory of their `W` lanes (any alignment).
pub(super) trait Lanes: Copy {
    const W: usize;
    type V: Copy;
    /// All lanes zero.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available (see [`Lanes`]).
    unsafe fn zero() -> Self::V;
    /// All lanes `x`.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn splat(x: f32) -> Self::V;
    /// `W` f32 from `p`.
    ///
    /// # Safety
    /// `p..p + W` must be readable (any alignment); `Self`'s instruction set available.
    unsafe fn load(p: *const f32) -> Self::V;
    /// `W` f16 (as bits) from `p`, widened exactly.
    ///
    /// # Safety
    /// `p..p + W` must be readable (any alignment); `Self`'s instruction set available.
    unsafe fn load_f16(p: *const u16) -> Self::V;
    /// `W` i8 from `p`, widened exactly.
    ///
    /// # Safety
    /// `p..p + W` must be readable (any alignment); `Self`'s instruction set available.
    unsafe fn load_i8(p: *const i8) -> Self::V;
    /// `W` f32 to `p`.
    ///
    /// # Safety
    /// `p..p + W` must be writable (any alignment); `Self`'s instruction set available.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a · b + c`, fused exactly when [`Lanes::scalar_fma`] is.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a · b`.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `e^x` per lane: [`Simd::exp`]'s operations, lane for lane (the same bits on 8 or 16 lanes).
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn exp(x: Self::V) -> Self::V;
    /// `a − b`.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    fn scalar_fma(a: f32, b: f32, c: f32) -> f32;
}

/// Eight lanes of a [`Simd`] implementation.
#[derive(Clone, Copy)]
pub(super) struct Eight<S>(std::marker::PhantomData<S>);

impl<S: Simd> Lanes for Eight<S> {
    const W: usize = 8;
    type V = S::V;
    #[inline(always)]
    unsafe fn zero() -> S::V {
        // SAFETY: `Lanes`' contract for `Eight<S>` is `S`'s instruction set, all `S::zero` needs.
        unsafe { S::zero() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> S::V {
        // SAFETY: `Lanes`' contract for `Eight<S>` is `S`'s instruction set, all `S::splat` needs.
        unsafe { S::splat(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> S::V {
        // SAFETY: with `W = 8`, `Lanes::load`'s contract (8 readable f32 at `p`, `S` available) is
        // `S::load`'s.
        unsafe { S::load(p) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> S::V {
        // SAFETY: with `W = 8`, `Lanes::load_f16`'s contract (8 readable u16 at `p`, `S` available) is
        // `S::load_f16`'s.
        unsafe { S::load_f16(p) }
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> S::V {
        // SAFETY: with `W = 8`, `Lanes::load_i8`'s contract (8 readable i8 at `p`, `S` available) is
        // `S::load_i8`'s.
        unsafe { S::load_i8(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: S::V) {
        // SAFETY: with `W = 8`, `Lanes::store`'s contract (8 writable f32 at `p`, `S` available) is
        // `S::store`'s.
        unsafe { S::store(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: S::V, b: S::V, c: S::V) -> S::V {
        // SAFETY: `Lanes`' contract for `Eight<S>` is `S`'s instruction set, all `S::mul_add` needs.
        unsafe { S::mul_add(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: S::V, b: S::V) -> S::V {
        // SAFETY: `Lanes`' contract for `Eight<S>` is `S`'s instruction set, all `S::mul` needs.
        unsafe { S::mul(a, b) }
    }
    #[inline(always)]
    unsafe fn exp(x: S::V) -> S::V {
        // SAFETY: `Lanes`' contract for `Eight<S>` is `S`'s instruction set, all `S::exp` needs.
        unsafe { S::exp(x) }
    }
    #[inline(always)]
    unsafe fn sub(a: S::V, b: S::V) -> S::V {
        // SAFETY: `Lanes`' contract for `Eight<S>` is `S`'s instruction set, all `S::sub` needs.
        unsafe { S::sub(a, b) }
    }
    #[inline(always)]
    fn scalar_fma(a: f32, b: f32, c: f32) -> f32 {
        S::scalar_mul_add(a, b, c)
    }
}

/// Sixteen AVX-512 lanes.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Sixteen;

#[cfg(target_arch = "x86_64")]
impl Lanes for Sixteen {
    const W: usize = 16;
    type V = std::arch::x86_64::__m512;
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        // SAFETY: AVX-512F is available (`Lanes`' contract for `Sixteen`).
        unsafe { std::arch::x86_64::_mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        // SAFETY: AVX-512F is available (`Lanes`' contract for `Sixteen`).
        unsafe { std::arch::x86_64::_mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: 16 f32 at `p` are readable and AVX-512F is available (`Lanes::load`'s contract);
        // `loadu` needs no alignment.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        use std::arch::x86_64::*;
        // SAFETY: 16 u16 at `p` are the 32 readable bytes the unaligned `_mm256_loadu_si256` reads
        // (`Lanes::load_f16`'s contract); `_mm512_cvtph_ps` needs AVX-512F, which the contract gives.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> Self::V {
        use std::arch::x86_64::*;
        // SAFETY: 16 i8 at `p` are the 16 readable bytes the unaligned `_mm_loadu_si128` reads
        // (`Lanes::load_i8`'s contract); the widenings need AVX-512F, which the contract gives.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: 16 f32 at `p` are writable and AVX-512F is available (`Lanes::store`'s contract);
        // `storeu` needs no alignment.
        unsafe { std::arch::x86_64::_mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: AVX-512F is available (`Lanes`' contract for `Sixteen`).
        unsafe { std::arch::x86_64::_mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: AVX-512F is available (`Lanes`' contract for `Sixteen`).
        unsafe { std::arch::x86_64::_mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn exp(x: Self::V) -> Self::V {
        use std::arch::x86_64::*;
        // SAFETY: register-only AVX-512F intrinsics (`Lanes`' contract for `Sixteen`).
        unsafe {
            // `simd::Avx2::exp`, operation for operation on 16 lanes (see there): the same clamps,
            // rounding to nearest, Cephes polynomial and two-step scaling by 2^n.
            let x = _mm512_min_ps(_mm512_set1_ps(88.72284), x);
            let x = _mm512_max_ps(_mm512_set1_ps(-104.0), x);
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
                x,
                _mm512_set1_ps(std::f32::consts::LOG2_E),
            ));
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
            let mut y = _mm512_set1_ps(1.987_569_1e-4);
            for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
                y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
            }
            let y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r);
            let y = _mm512_add_ps(y, _mm512_set1_ps(1.0));
            let ni = _mm512_cvtps_epi32(n);
            let half = _mm512_srai_epi32::<1>(ni);
            let pow = |e: __m512i| {
                _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
                    e,
                    _mm512_set1_epi32(127),
                )))
            };
            _mm512_mul_ps(_mm512_mul_ps(y, pow(half)), pow(_mm512_sub_epi32(ni, half)))
        }
    }
    #[inline(always)]
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: AVX-512F is available (`Lanes`' contract for `Sixteen`).
        unsafe { std::arch::x86_64::_mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn scalar_fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// A cache element: `f32`, `u16` holding the bits of an f16 (widened exactly when read), or `i8` of an
/// 8-bit cache (widened exactly; its vector's scale applied by the kernel).
pub(super) trait KvElem: Copy + Send + Sync {
    /// Whether each cached vector carries a scale (`t.k_scales`, `t.v_scales` of the walk).
    const SCALED: bool = false;
    /// `L::W` elements from `p` as f32 lanes.
    ///
    /// # Safety
    /// `p..p + L::W` must be readable (any alignment) and `L`'s instruction set available.
    unsafe fn load<L: Lanes>(p: *const Self) -> L::V;
    fn to_f32(self) -> f32;
}

impl KvElem for f32 {
    #[inline(always)]
    unsafe fn load<L: Lanes>(p: *const f32) -> L::V {
        // SAFETY: `KvElem::load`'s contract (`L::W` readable f32 at `p`, `L` available) is `L::load`'s.
        unsafe { L::load(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for u16 {
    #[inline(always)]
    unsafe fn load<L: Lanes>(p: *const u16) -> L::V {
        // SAFETY: `KvElem::load`'s contract (`L::W` readable u16 at `p`, `L` available) is
        // `L::load_f16`'s.
        unsafe { L::load_f16(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::from_bits(self).to_f32()
    }
}

impl KvElem for i8 {
    const SCALED: bool = true;
    #[inline(always)]
    unsafe fn load<L: Lanes>(p: *const i8) -> L::V {
        // SAFETY: `KvElem::load`'s contract (`L::W` readable i8 at `p`, `L` available) is `L::load_i8`'s.
        unsafe { L::load_i8(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
}
