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
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                if std::env::var_os("MODELFLEET_NO_AVX512").is_none()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    return Isa::Avx512;
                }
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Whether the AVX2 (+FMA, F16C) instructions are available.
    pub fn has_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512)
    }
}

/// Element types a weight can be loaded from, 8 at a time, as f32 lanes.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// # Safety
    /// `p..p+8` must be readable.
    unsafe fn load<S: Simd>(p: *const Self) -> S::V;
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
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
        unsafe { S::load_bf16(p.cast()) }
    }
}

/// Eight f32 lanes.
pub(crate) trait Simd: Copy + Send + Sync + 'static {
    type V: Copy;
    /// All lanes zero.
    unsafe fn zero() -> Self::V;
    /// All lanes `v`.
    unsafe fn splat(v: f32) -> Self::V;
    /// Eight f32 from `p`.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Eight f16 (as bits) from `p`, widened.
    unsafe fn load_f16(p: *const u16) -> Self::V;
    /// Eight bf16 (as bits) from `p`, widened.
    unsafe fn load_bf16(p: *const u16) -> Self::V;
    /// Eight f32 to `p`.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + c` (fused on AVX2).
    unsafe fn mul_add(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a * b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a - b`.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`.
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// Sum of the lanes in a fixed order.
    unsafe fn hsum(v: Self::V) -> f32;
    /// Scalar `a * b + c`, fused exactly when [`Simd::mul_add`] is.
    fn scalar_mul_add(a: f32, b: f32, c: f32) -> f32;
    /// `e^x` per lane: `f32::exp` on the portable ISA; on AVX2 a vectorised Cephes-style evaluation
    /// (range reduction by `ln 2`, a degree-7 polynomial, the exponent set directly; within 2 ulp of
    /// the true value over the normal range, tested), 0 far below the subnormals, NaN for NaN.
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
        unsafe { p.cast::<[f32; 8]>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        let bits = unsafe { p.cast::<[u16; 8]>().read_unaligned() };
        bits.map(|b| f16::from_bits(b).to_f32())
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::V {
        let bits = unsafe { p.cast::<[u16; 8]>().read_unaligned() };
        bits.map(|b| f32::from_bits((b as u32) << 16))
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
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

    /// AVX2 + FMA + F16C; only used after [`super::Isa::detect`] found them.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2;

    impl Simd for Avx2 {
        type V = __m256;
        #[inline(always)]
        unsafe fn zero() -> Self::V {
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self::V {
            unsafe { _mm256_set1_ps(v) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self::V {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> Self::V {
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self::V {
            unsafe {
                let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))
            }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self::V) {
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn mul_add(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn sub(a: Self::V, b: Self::V) -> Self::V {
            unsafe { _mm256_sub_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn div(a: Self::V, b: Self::V) -> Self::V {
            unsafe { _mm256_div_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn hsum(v: Self::V) -> f32 {
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
#[inline(always)]
pub(crate) unsafe fn exp_shifted<S: Simd>(x: &[f32], shift: f32, out: &mut [f32]) {
    let n = x.len().min(out.len());
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
#[inline(always)]
pub(crate) unsafe fn silu<S: Simd>(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
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

/// The first 8 elements of `x` (zero-padded when shorter) and whether there were 8.
#[inline(always)]
unsafe fn load_padded<S: Simd>(x: &[f32]) -> (S::V, bool) {
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
#[inline(always)]
unsafe fn store_part<S: Simd>(v: S::V, out: &mut [f32], full: bool) {
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
#[inline(always)]
pub(crate) unsafe fn scale<S: Simd>(a: f32, y: &mut [f32]) {
    let n8 = y.len() / 8 * 8;
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
