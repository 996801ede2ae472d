//! Row dequantization for the matmul's quantized path, vectorised with AVX2 for the 32-element formats
//! (Q4_0, Q4_1, Q8_0) and falling back to [`crate::quant::dequantize_row`] otherwise; plus fused
//! dequantize-and-dot for small batches (decode), which skips the scratch row.
//!
//! Invariants: the AVX2 code performs exactly the scalar reference's f32 operations (an exact int→f32
//! conversion, then a separate multiply and add — never a fused one), so both paths give bit-identical
//! weights (tested), and a weight means the same number as in ggml's `dequantize_row_*`. The fused dot
//! accumulates the same 8-lane chunks in the same order with the same FMA as the matmul's f32 tiles over
//! a dequantized row, so a row's result does not depend on which path its batch size selects.

use super::simd::Isa;
use crate::quant::{QuantKind, dequantize_row};

/// Dequantizes a row of blocks into `out` with the fastest code `isa` allows.
pub(crate) fn dequantize(isa: Isa, kind: QuantKind, bytes: &[u8], out: &mut [f32]) {
    match (isa, kind) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, QuantKind::Q4_0 | QuantKind::Q4_1 | QuantKind::Q8_0) => {
            assert_eq!(
                bytes.len() / kind.block_bytes() * 32,
                out.len(),
                "dequantize row length"
            );
            // SAFETY: AVX2/F16C were detected for `Isa::Avx2`; lengths checked above.
            unsafe { avx2::row(kind, bytes, out) }
        }
        _ => dequantize_row(kind, bytes, out),
    }
}

/// Whether [`dot_rows`] handles `kind` on `isa`.
pub(crate) fn fused(isa: Isa, kind: QuantKind) -> bool {
    cfg!(target_arch = "x86_64")
        && isa == Isa::Avx2
        && matches!(kind, QuantKind::Q4_0 | QuantKind::Q4_1 | QuantKind::Q8_0)
}

/// `out[r] = dot(xs[r], dequantize(w_row))` for up to 3 rows, computed exactly as the f32 tile computes
/// it over a dequantized row (only when [`fused`] says so).
pub(crate) fn dot_rows(kind: QuantKind, w_row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let k = w_row.len() / kind.block_bytes() * 32;
        assert!(
            xs.len() <= 3 && xs.iter().all(|x| x.len() >= k) && out.len() >= xs.len(),
            "dot_rows shapes"
        );
        // SAFETY: callers check `fused` (AVX2/F16C detected); lengths checked above.
        unsafe { avx2::dot_rows(kind, w_row, xs, out) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "dot_rows without AVX2 ({kind:?}, {} bytes, {} rows, {})",
        w_row.len(),
        xs.len(),
        out.len()
    )
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::quant::QuantKind;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn scale(p: *const u8) -> __m256 {
        unsafe {
            let bits = (p.read() as i32) | ((p.add(1).read() as i32) << 8);
            _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits))))
        }
    }

    /// Eight unsigned bytes (the low 8 of `v`) as f32.
    #[inline(always)]
    unsafe fn u8x8(v: __m128i) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)) }
    }

    /// Eight unsigned bytes minus 8, as f32.
    #[inline(always)]
    unsafe fn u8x8_minus8(v: __m128i) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(v), _mm256_set1_epi32(8))) }
    }

    /// One block's 32 weights as four vectors. (Written without closures: a closure does not inherit
    /// the caller's target features, which would turn every intrinsic into a call.)
    #[inline(always)]
    unsafe fn block(kind: QuantKind, p: *const u8) -> [__m256; 4] {
        unsafe {
            let mask = _mm_set1_epi8(0x0F);
            match kind {
                QuantKind::Q8_0 => {
                    let d = scale(p);
                    let q0 = _mm_loadl_epi64(p.add(2).cast());
                    let q1 = _mm_loadl_epi64(p.add(10).cast());
                    let q2 = _mm_loadl_epi64(p.add(18).cast());
                    let q3 = _mm_loadl_epi64(p.add(26).cast());
                    [
                        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)), d),
                        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)), d),
                        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q2)), d),
                        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q3)), d),
                    ]
                }
                QuantKind::Q4_0 => {
                    let d = scale(p);
                    let qs = _mm_loadu_si128(p.add(2).cast());
                    let (lo, hi) = (
                        _mm_and_si128(qs, mask),
                        _mm_and_si128(_mm_srli_epi16(qs, 4), mask),
                    );
                    [
                        _mm256_mul_ps(u8x8_minus8(lo), d),
                        _mm256_mul_ps(u8x8_minus8(_mm_srli_si128(lo, 8)), d),
                        _mm256_mul_ps(u8x8_minus8(hi), d),
                        _mm256_mul_ps(u8x8_minus8(_mm_srli_si128(hi, 8)), d),
                    ]
                }
                _ => {
                    let (d, m) = (scale(p), scale(p.add(2)));
                    let qs = _mm_loadu_si128(p.add(4).cast());
                    let (lo, hi) = (
                        _mm_and_si128(qs, mask),
                        _mm_and_si128(_mm_srli_epi16(qs, 4), mask),
                    );
                    [
                        _mm256_add_ps(_mm256_mul_ps(u8x8(lo), d), m),
                        _mm256_add_ps(_mm256_mul_ps(u8x8(_mm_srli_si128(lo, 8)), d), m),
                        _mm256_add_ps(_mm256_mul_ps(u8x8(hi), d), m),
                        _mm256_add_ps(_mm256_mul_ps(u8x8(_mm_srli_si128(hi, 8)), d), m),
                    ]
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows(kind: QuantKind, w: &[u8], xs: &[&[f32]], out: &mut [f32]) {
        use crate::cpu::simd::{Avx2, Simd};
        let bb = kind.block_bytes();
        let mut acc = [_mm256_setzero_ps(); 3];
        for (b, blk) in w.chunks_exact(bb).enumerate() {
            let wv = unsafe { block(kind, blk.as_ptr()) };
            for (r, x) in xs.iter().enumerate() {
                for (j, v) in wv.iter().enumerate() {
                    let xv = unsafe { _mm256_loadu_ps(x.as_ptr().add(32 * b + 8 * j)) };
                    acc[r] = _mm256_fmadd_ps(xv, *v, acc[r]);
                }
            }
        }
        for r in 0..xs.len() {
            // `+ 0.0` twice: the f32 tile adds its (empty) tail, then the matmul adds a zero bias.
            out[r] = (unsafe { Avx2::hsum(acc[r]) } + 0.0) + 0.0;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row(kind: QuantKind, bytes: &[u8], out: &mut [f32]) {
        for (i, blk) in bytes.chunks_exact(kind.block_bytes()).enumerate() {
            unsafe {
                let v = block(kind, blk.as_ptr());
                let o = out.as_mut_ptr().add(32 * i);
                _mm256_storeu_ps(o, v[0]);
                _mm256_storeu_ps(o.add(8), v[1]);
                _mm256_storeu_ps(o.add(16), v[2]);
                _mm256_storeu_ps(o.add(24), v[3]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectorised_rows_equal_the_reference_bit_for_bit() {
        let mut s = 12345u64;
        for kind in [QuantKind::Q4_0, QuantKind::Q4_1, QuantKind::Q8_0] {
            let mut bytes: Vec<u8> = (0..7 * kind.block_bytes())
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (s >> 56) as u8
                })
                .collect();
            for (i, blk) in bytes.chunks_exact_mut(kind.block_bytes()).enumerate() {
                blk[..2].copy_from_slice(&half::f16::from_f32(0.02 * (i as f32 - 3.0)).to_le_bytes());
                if kind == QuantKind::Q4_1 {
                    blk[2..4].copy_from_slice(&half::f16::from_f32(-0.1 * i as f32).to_le_bytes());
                }
            }
            let mut want = vec![0.0; 7 * 32];
            dequantize_row(kind, &bytes, &mut want);
            let mut got = vec![0.0; 7 * 32];
            dequantize(Isa::detect(), kind, &bytes, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{kind:?}");
        }
    }
}
