//! The 8-lane vector abstraction the CPU kernels are written against, with a portable implementation
//! and an x86-64 AVX2+FMA+F16C one chosen once per process.
//!
//! Invariants (batch invariance rests on them): every reduction a kernel performs for one output
//! element is a fixed sequence of these operations whose order depends only on that element's inputs
//! (lane `l` accumulates elements `l, l+8, l+16, …` in order; `Simd::hsum` folds lanes in one fixed
//! tree; a tail shorter than 8 is added afterwards, in order). Nothing here depends on how many rows a
//! batch has, so a row's result is bit-identical alone or in any batch. The portable path uses separate
//! multiply and add (Rust never contracts them); the AVX2 path uses fused multiply-add, so the two ISAs
//! differ in the last bits but each is deterministic.
//!
//! Design: the "generic kernel, monomorphised per ISA inside a `#[target_feature]` entry point" pattern
//! (as in the `pulp` and `multiversion` crates): kernels are `#[inline(always)]` generics over `Simd`.

use half::{bf16, f16};

/// The instruction set the CPU kernels use.
///
/// Invariant (the kernels' `unsafe` blocks rely on it): a kernel is only handed an `Isa` whose
/// instructions this CPU has. [`Isa::detect`] checks them with `is_x86_feature_detected!`,
/// `CpuKernels::with_isa` asserts them (`Isa::is_available`), and the tests pass only the detected
/// ISA or a lesser one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust on `[f32; 8]` lanes; runs everywhere.
    Portable,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// [`Isa::Avx2`] plus AVX-512 F/BW/VL/VNNI: the float and integer matmuls use 512-bit tiles (the
    /// float ones with results identical to AVX2's); every other kernel runs its AVX2 code.
    Avx512,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        if Isa::Avx2.is_available() {
            if std::env::var_os("MODELFLEET_NO_AVX512").is_none() && Isa::Avx512.is_available() {
                return Isa::Avx512;
            }
            return Isa::Avx2;
        }
        Isa::Portable
    }

    /// Whether this CPU has every extension `self` uses (what [`Isa::detect`] checks, without its
    /// `MODELFLEET_NO_AVX512` switch). Off x86-64 only [`Isa::Portable`] is.
    pub(crate) fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            match self {
                Isa::Portable => true,
                Isa::Avx2 => avx2,
                Isa::Avx512 => {
                    avx2 && is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vl")
                        && is_x86_feature_detected!("avx512vnni")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Portable
        }
    }

    /// Whether the AVX2 (+FMA, F16C) instructions are available.
    pub fn has_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512)
    }
}

/// Element types a weight can be loaded from, 8 at a time, as f32 lanes.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// Eight elements from `p`, widened to f32 lanes.
    ///
    /// # Safety
    /// `p..p+8` must be readable (any alignment), and `S`'s instruction set available (see [`Simd`]).
    unsafe fn load<S: Simd>(p: *const Self) -> S::V;
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: `Elem::load`'s contract (8 readable f32 at `p`, `S` available) is `S::load`'s.
        unsafe { S::load(p) }
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: `f16` is `repr(transparent)` over its `u16` bits, so the cast pointer addresses the
        // same 8 readable elements (`Elem::load`'s contract) that `S::load_f16` reads; `S` is available
        // by the same contract.
        unsafe { S::load_f16(p.cast()) }
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: `bf16` is `repr(transparent)` over its `u16` bits, so the cast pointer addresses the
        // same 8 readable elements (`Elem::load`'s contract) that `S::load_bf16` reads; `S` is available
        // by the same contract.
        unsafe { S::load_bf16(p.cast()) }
    }
}

/// Eight f32 lanes.
///
/// # Safety
/// Every `unsafe fn` here may execute the implementation's instructions, so it may only be called
/// where they exist: [`Avx2`]'s need AVX2, FMA and F16C, which in practice means from inside the
/// `#[target_feature(enable = "avx2,fma,f16c")]` entry points (`run_avx2`, `silu_mul_avx2`, …) that
/// the kernels reach only for a detected [`Isa`] (see its invariant); [`Portable`] needs nothing.
/// The pointer methods also need the memory of their 8 lanes (any alignment), as each one says.
pub(crate) trait Simd: Copy + Send + Sync + 'static {
    type V: Copy;
    /// All lanes zero.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available (see [`Simd`]).
    unsafe fn zero() -> Self::V;
    /// All lanes `v`.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn splat(v: f32) -> Self::V;
    /// Eight f32 from `p`.
    ///
    /// # Safety
    /// `p..p + 8` must be readable f32 (any alignment); `Self`'s instruction set available.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Eight f16 (as bits) from `p`, widened.
    ///
    /// # Safety
    /// `p..p + 8` must be readable u16 (any alignment); `Self`'s instruction set available.
    unsafe fn load_f16(p: *const u16) -> Self::V;
    /// Eight `i8` from `p`, widened exactly.
    ///
    /// # Safety
    /// `p..p + 8` must be readable (any alignment); `Self`'s instruction set available.
    unsafe fn load_i8(p: *const i8) -> Self::V;
    /// Eight bf16 (as bits) from `p`, widened.
    ///
    /// # Safety
    /// `p..p + 8` must be readable u16 (any alignment); `Self`'s instruction set available.
    unsafe fn load_bf16(p: *const u16) -> Self::V;
    /// Eight f32 to `p`.
    ///
    /// # Safety
    /// `p..p + 8` must be writable f32 (any alignment); `Self`'s instruction set available.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + c` (fused on AVX2).
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn mul_add(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a * b`.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a + b`.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a - b`.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// `|a|`, lane by lane.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn abs(a: Self::V) -> Self::V;
    /// Sum of the lanes in a fixed order.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn hsum(v: Self::V) -> f32;
    /// Scalar `a * b + c`, fused exactly when [`Simd::mul_add`] is.
    fn scalar_mul_add(a: f32, b: f32, c: f32) -> f32;
    /// `e^x` per lane: `f32::exp` on the portable ISA; on AVX2 a vectorised Cephes-style evaluation
    /// (range reduction by `ln 2`, a degree-7 polynomial, the exponent set directly; within 2 ulp of
    /// the true value over the normal range, tested), 0 far below the subnormals, NaN for NaN.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn exp(x: Self::V) -> Self::V;
    /// A hint to bring the line at `p` into the cache; never faults (any address is fine).
    #[inline(always)]
    fn prefetch(p: *const u8) {
        let _ = p;
    }
}

/// The portable implementation.
#[derive(Clone, Copy)]
pub(crate) struct Portable;

impl Simd for Portable {
    type V = [f32; 8];
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self::V {
        [v; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: `p..p + 8` is readable (`Simd::load`'s contract) and `read_unaligned` needs no
        // alignment; any bits are a valid `[f32; 8]`.
        unsafe { p.cast::<[f32; 8]>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        // SAFETY: `p..p + 8` is readable (`Simd::load_f16`'s contract); unaligned read of plain `u16`s.
        let bits = unsafe { p.cast::<[u16; 8]>().read_unaligned() };
        bits.map(|b| f16::from_bits(b).to_f32())
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> Self::V {
        // SAFETY: `p..p + 8` is readable (`Simd::load_i8`'s contract); unaligned read of plain `i8`s.
        let q = unsafe { p.cast::<[i8; 8]>().read_unaligned() };
        q.map(|v| v as f32)
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::V {
        // SAFETY: `p..p + 8` is readable (`Simd::load_bf16`'s contract); unaligned read of plain `u16`s.
        let bits = unsafe { p.cast::<[u16; 8]>().read_unaligned() };
        bits.map(|b| f32::from_bits((b as u32) << 16))
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: `p..p + 8` is writable (`Simd::store`'s contract); `write_unaligned` needs no alignment.
        unsafe { p.cast::<[f32; 8]>().write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn mul_add(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] * b[l] + c[l])
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] * b[l])
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] + b[l])
    }
    #[inline(always)]
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] - b[l])
    }
    #[inline(always)]
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] / b[l])
    }
    #[inline(always)]
    unsafe fn abs(a: Self::V) -> Self::V {
        a.map(f32::abs)
    }
    #[inline(always)]
    unsafe fn hsum(v: Self::V) -> f32 {
        // The same tree as the AVX2 path: halves, then pairs, then the last two.
        let h: [f32; 4] = std::array::from_fn(|l| v[l] + v[l + 4]);
        let q = [h[0] + h[2], h[1] + h[3]];
        q[0] + q[1]
    }
    #[inline(always)]
    fn scalar_mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
    #[inline(always)]
    unsafe fn exp(x: Self::V) -> Self::V {
        x.map(f32::exp)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::Avx2;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Simd;
    use std::arch::x86_64::*;

    /// AVX2 + FMA + F16C; only used after [`super::Isa::detect`] found them. Every method below relies
    /// on [`Simd`]'s contract that its caller runs where AVX2, FMA and F16C are available.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2;

    impl Simd for Avx2 {
        type V = __m256;
        #[inline(always)]
        unsafe fn zero() -> Self::V {
            // SAFETY: `_mm256_setzero_ps` needs AVX, which the caller guarantees (`Simd`'s contract).
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self::V {
            // SAFETY: `_mm256_set1_ps` needs AVX, which the caller guarantees (`Simd`'s contract).
            unsafe { _mm256_set1_ps(v) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self::V {
            // SAFETY: the caller guarantees `p..p + 8` readable and AVX available (`Simd::load`); the
            // `loadu` form has no alignment requirement.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> Self::V {
            // SAFETY: 8 u16 at `p` are the 16 readable bytes the unaligned `_mm_loadu_si128` reads
            // (`Simd::load_f16`'s contract); `_mm256_cvtph_ps` needs F16C, which the caller guarantees.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_i8(p: *const i8) -> Self::V {
            // SAFETY: 8 i8 at `p` are the 8 readable bytes the unaligned `_mm_loadl_epi64` reads
            // (`Simd::load_i8`'s contract); the widenings need AVX2, which the caller guarantees.
            unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self::V {
            // SAFETY: 8 u16 at `p` are the 16 readable bytes the unaligned `_mm_loadu_si128` reads
            // (`Simd::load_bf16`'s contract); the widening and shift need AVX2, which the caller
            // guarantees.
            unsafe {
                let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))
            }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self::V) {
            // SAFETY: the caller guarantees `p..p + 8` writable and AVX available (`Simd::store`); the
            // `storeu` form has no alignment requirement.
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn mul_add(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
            // SAFETY: `_mm256_fmadd_ps` needs FMA, which the caller guarantees (`Simd`'s contract).
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: `_mm256_mul_ps` needs AVX, which the caller guarantees (`Simd`'s contract).
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: `_mm256_add_ps` needs AVX, which the caller guarantees (`Simd`'s contract).
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn sub(a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: `_mm256_sub_ps` needs AVX, which the caller guarantees (`Simd`'s contract).
            unsafe { _mm256_sub_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn div(a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: `_mm256_div_ps` needs AVX, which the caller guarantees (`Simd`'s contract).
            unsafe { _mm256_div_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn abs(a: Self::V) -> Self::V {
            // SAFETY: `_mm256_andnot_ps` needs AVX, which the caller guarantees (`Simd`'s contract).
            unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), a) }
        }
        #[inline(always)]
        unsafe fn hsum(v: Self::V) -> f32 {
            // SAFETY: register-only AVX (the 128-bit extract) and SSE (baseline on x86-64) shuffles and
            // adds; the caller guarantees AVX (`Simd`'s contract).
            unsafe {
                let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
                _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)))
            }
        }
        #[inline(always)]
        fn scalar_mul_add(a: f32, b: f32, c: f32) -> f32 {
            a.mul_add(b, c)
        }
        #[inline(always)]
        unsafe fn exp(x: Self::V) -> Self::V {
            // SAFETY: register-only AVX (min, max, round, mul, convert), FMA (`fmadd`, `fnmadd`) and
            // AVX2 (the 256-bit integer add, sub and shifts) intrinsics; the caller guarantees all three
            // (`Simd`'s contract).
            unsafe {
                // x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in two for an exact product), then
                // e^r by its Taylor polynomial (Cephes `expf` coefficients) and 2^n through the
                // exponent bits, in two halves so that n down to −150 scales to subnormals and zero.
                // Clamped with the constant first, so a NaN lane stays NaN.
                let x = _mm256_min_ps(_mm256_set1_ps(88.72284), x);
                let x = _mm256_max_ps(_mm256_set1_ps(-104.0), x);
                let n = _mm256_round_ps(
                    _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
                );
                let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
                let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
                let mut y = _mm256_set1_ps(1.987_569_1e-4);
                for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
                    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
                }
                let y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
                let y = _mm256_add_ps(y, _mm256_set1_ps(1.0));
                let ni = _mm256_cvtps_epi32(n);
                let half = _mm256_srai_epi32(ni, 1);
                let pow = |e: __m256i| {
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23))
                };
                _mm256_mul_ps(_mm256_mul_ps(y, pow(half)), pow(_mm256_sub_epi32(ni, half)))
            }
        }
        #[inline(always)]
        fn prefetch(p: *const u8) {
            // SAFETY: a prefetch is a hint and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
        }
    }
}

/// `out[i] = e^(x[i] - shift)` ([`Simd::exp`]); a tail shorter than 8 lanes is padded, so every element
/// gets the same operations whatever its position.
///
/// # Safety
/// `S`'s instruction set must be available (see [`Simd`]); the slices may have any lengths (the shorter
/// one bounds the work).
#[inline(always)]
pub(crate) unsafe fn exp_shifted<S: Simd>(x: &[f32], shift: f32, out: &mut [f32]) {
    let n = x.len().min(out.len());
    // SAFETY: `S` is available (our contract). Memory is only touched through `load_padded` and
    // `store_part` on the checked subslices `x[i..n]` and `out[i..n]` (`i < n`, both as long), and the
    // `full` flag passed to `store_part` is `load_padded`'s for a slice of that same length.
    unsafe {
        let sv = S::splat(shift);
        let mut i = 0;
        while i < n {
            let (xv, full) = load_padded::<S>(&x[i..n]);
            let y = S::exp(S::sub(xv, sv));
            store_part::<S>(y, &mut out[i..n], full);
            i += 8;
        }
    }
}

/// `out[i] = x[i] / (1 + e^-x[i])` (SiLU), with the same padding as [`exp_shifted`].
///
/// # Safety
/// As for [`exp_shifted`]: `S`'s instruction set must be available.
#[inline(always)]
pub(crate) unsafe fn silu<S: Simd>(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    // SAFETY: as in `exp_shifted`: `S` is available (our contract), and memory is only touched through
    // `load_padded`/`store_part` on the equally long checked subslices `x[i..n]` and `out[i..n]`.
    unsafe {
        let one = S::splat(1.0);
        let mut i = 0;
        while i < n {
            let (xv, full) = load_padded::<S>(&x[i..n]);
            let y = S::div(xv, S::add(one, S::exp(S::sub(S::zero(), xv))));
            store_part::<S>(y, &mut out[i..n], full);
            i += 8;
        }
    }
}

/// `out[i] = gelu(x[i])` with the tanh approximation (PyTorch's `gelu(approximate="tanh")`, Gemma's
/// `gelu_pytorch_tanh`): `½x(1 + tanh(y))` with `y = √(2/π)(x + 0.044715x³)`, computed as the equal
/// `x / (1 + e^(−2y))` so it shares [`Simd::exp`] with SiLU; same padding as [`exp_shifted`].
///
/// # Safety
/// As for [`exp_shifted`]: `S`'s instruction set must be available.
#[inline(always)]
pub(crate) unsafe fn gelu_tanh<S: Simd>(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    // SAFETY: as in `silu`: `S` is available (our contract), and memory is only touched through
    // `load_padded`/`store_part` on the equally long checked subslices `x[i..n]` and `out[i..n]`.
    unsafe {
        let one = S::splat(1.0);
        // −2·√(2/π) and −2·√(2/π)·0.044715.
        let c1 = S::splat(-1.595_769_2);
        let c3 = S::splat(-0.071_354_816);
        let mut i = 0;
        while i < n {
            let (xv, full) = load_padded::<S>(&x[i..n]);
            let x2 = S::mul(xv, xv);
            let z = S::mul(xv, S::mul_add(c3, x2, c1));
            let y = S::div(xv, S::add(one, S::exp(z)));
            store_part::<S>(y, &mut out[i..n], full);
            i += 8;
        }
    }
}

/// `x = x/2 · (1 + erf(x/√2))` in place, the exact GELU, with erf from Abramowitz and Stegun 7.1.26 (absolute
/// error below 1.5e-7: `1 − t·(a₁ + t(a₂ + t(a₃ + t(a₄ + t·a₅))))·e^{−u²}` at `t = 1/(1 + p·|u|)`, odd
/// in `u`).
///
/// # Safety
/// `S`'s instruction set must be available.
#[inline(always)]
pub(crate) unsafe fn gelu_erf<S: Simd>(x: &mut [f32]) {
    let n = x.len();
    // SAFETY: as in `silu`: `S` is available (our contract), and memory is only touched through
    // `load_padded`/`store_part` on the checked subslice `x[i..n]`.
    unsafe {
        let (one, half) = (S::splat(1.0), S::splat(0.5));
        let (p, inv_sqrt2) = (S::splat(0.327_591_1), S::splat(std::f32::consts::FRAC_1_SQRT_2));
        let a = [0.254_829_6, -0.284_496_74, 1.421_413_7, -1.453_152_1, 1.061_405_4].map(|c| S::splat(c));
        let mut i = 0;
        while i < n {
            let (xv, full) = load_padded::<S>(&x[i..n]);
            let u = S::mul(xv, inv_sqrt2);
            let au = S::abs(u);
            let t = S::div(one, S::mul_add(p, au, one));
            let mut poly = a[4];
            for c in a[..4].iter().rev() {
                poly = S::mul_add(poly, t, *c);
            }
            let e = S::exp(S::sub(S::zero(), S::mul(au, au)));
            let erf_abs = S::sub(one, S::mul(S::mul(poly, t), e));
            // x·erf(u) = x·sign(u)·erf(|u|) = |x|·erf(|u|): no sign needed.
            let y = S::mul(half, S::add(xv, S::mul(S::abs(xv), erf_abs)));
            store_part::<S>(y, &mut x[i..n], full);
            i += 8;
        }
    }
}

/// The first 8 elements of `x` (zero-padded when shorter) and whether there were 8.
///
/// # Safety
/// `S`'s instruction set must be available.
#[inline(always)]
unsafe fn load_padded<S: Simd>(x: &[f32]) -> (S::V, bool) {
    // SAFETY: 8 lanes are loaded from `x` only when `x.len() >= 8`, otherwise from the local 8-element
    // `pad`; `S` is available (our contract).
    unsafe {
        if x.len() >= 8 {
            (S::load(x.as_ptr()), true)
        } else {
            let mut pad = [0.0f32; 8];
            pad[..x.len()].copy_from_slice(x);
            (S::load(pad.as_ptr()), false)
        }
    }
}

/// Stores the lanes of `v` that `out` has room for (all 8 when `full`).
///
/// # Safety
/// `S`'s instruction set must be available, and `out` must hold at least 8 elements when `full`.
#[inline(always)]
unsafe fn store_part<S: Simd>(v: S::V, out: &mut [f32], full: bool) {
    debug_assert!(
        !full || out.len() >= 8,
        "a full store into {} elements",
        out.len()
    );
    // SAFETY: with `full`, `out` holds at least 8 elements (our contract, checked above in debug
    // builds); otherwise the 8 lanes go to the local `res` and only `min(len, 8)` of them are copied
    // with checked slicing. `S` is available (our contract).
    unsafe {
        if full {
            S::store(out.as_mut_ptr(), v);
        } else {
            let mut res = [0.0f32; 8];
            S::store(res.as_mut_ptr(), v);
            let n = out.len().min(8);
            out[..n].copy_from_slice(&res[..n]);
        }
    }
}

/// `y = a * y` in place.
///
/// # Safety
/// `S`'s instruction set must be available.
#[inline(always)]
pub(crate) unsafe fn scale<S: Simd>(a: f32, y: &mut [f32]) {
    let n8 = y.len() / 8 * 8;
    // SAFETY: each load and store covers `y[i..i + 8]` with `i + 8 <= n8 <= y.len()` (the loop
    // condition, `n8` being the length rounded down to a multiple of 8); `S` is available (our contract).
    unsafe {
        let av = S::splat(a);
        let mut i = 0;
        while i < n8 {
            S::store(y.as_mut_ptr().add(i), S::mul(av, S::load(y.as_ptr().add(i))));
            i += 8;
        }
    }
    for v in &mut y[n8..] {
        *v *= a;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp_all<S: Simd>(x: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; x.len()];
        // SAFETY: only called for ISAs this CPU has.
        unsafe { exp_shifted::<S>(x, 0.0, &mut out) };
        out
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exp_avx2(x: &[f32]) -> Vec<f32> {
        exp_all::<Avx2>(x)
    }

    #[test]
    fn vector_exp_is_within_two_ulp_and_handles_the_edges() {
        #[cfg(target_arch = "x86_64")]
        if Isa::detect().has_avx2() {
            // A dense sweep of the range whose results are normal floats, plus a tail of 5 (padding).
            let xs: Vec<f32> = (0..200_005)
                .map(|i| -87.0 + 175.0 * i as f32 / 200_000.0)
                .collect();
            // SAFETY: AVX2 detected.
            let got = unsafe { exp_avx2(&xs) };
            for (x, g) in xs.iter().zip(&got) {
                let want = (*x as f64).exp() as f32;
                let ulps = (g.to_bits() as i64 - want.to_bits() as i64).abs();
                assert!(ulps <= 2, "exp({x}) = {g}, want {want} ({ulps} ulp)");
            }
            // SAFETY: AVX2 detected.
            let edge = unsafe { exp_avx2(&[f32::NEG_INFINITY, -200.0, 0.0, f32::NAN, 89.0, -0.0, 1.0]) };
            assert_eq!(edge[0], 0.0);
            assert_eq!(edge[1], 0.0);
            assert_eq!(edge[2], 1.0);
            assert!(edge[3].is_nan());
            assert!(edge[4] > 3.0e38);
            assert_eq!(edge[5], 1.0);
            assert!((edge[6] - std::f32::consts::E).abs() <= f32::EPSILON * 3.0);
        }
        // The portable lanes are `f32::exp`.
        let xs = [-3.5f32, 0.25, 7.0];
        assert_eq!(exp_all::<Portable>(&xs), xs.map(f32::exp).to_vec());
    }
}
