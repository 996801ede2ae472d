//! AVX-512 VNNI integer dot products for every quantized format (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
//! Q6_K) against 8-bit activation blocks ([`super::qdot::Q8Block`]), the weights decoded by the AVX2
//! tiles' `unit` (units of 32 values: a block, or a K-quant sub-block): two units per 512-bit register, one `vpdpbusd` (unsigned × signed
//! bytes, four products summed per 32-bit lane) per pair of blocks, against `maddubs` + `madd` + a sign
//! fix-up per block with AVX2. Tiles of up to 4 activation rows × 4 weight rows share every load; the
//! matmul uses 4 × 4 (measured 10–20% faster than 4 × 2 on 16- and 64-row products) and 1 × 2 for a
//! single row.
//!
//! `vpdpbusd` multiplies an unsigned operand by a signed one. Q4_1, Q5_1 and Q4_K weights are unsigned, so
//! they go in as they are. For the signed formats (Q8_0, Q4_0, Q5_0, Q6_K) the activations are offset to unsigned
//! (`x + 128`, a flip of the top bit) and the excess `128 · Σw` — computed once per weight block pair
//! with the same instruction — starts the accumulator negated: the integer sums are exact either way.
//!
//! Invariants: each output is the same sequence whatever the tile: per pair of blocks, the exact
//! integer sums (lanes 0–7 the even block, 8–15 the odd one), converted to f32 and fused into a 16-lane
//! accumulator with the scale `d_w · d_x` (for Q6_K, lanes 0–3 and 4–7 of a unit — its two 16-value
//! sub-blocks — each with its own `d · sc`, where AVX2 multiplies the integer sums by `sc`); then a fixed
//! 16-lane sum, plus (Q4_1, Q5_1, Q4_K) the minimums' term `Σ m · s` added unit by unit. So batch
//! invariance holds; the result differs from the AVX2 path in rounding order only (the integer sums of
//! 4 values are identical).

use super::qdot::avx2::unit;
use super::qdot::{
    Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q6K, Q8_0, Q8Block, code_block_bytes, code_signed, code_units, tile_dispatch,
};
use crate::quant::QuantKind;
use std::arch::x86_64::*;

/// Largest tile.
pub(crate) const ROWS: usize = 4;
/// Largest tile.
pub(crate) const COLS: usize = 4;

/// `out[r][c] = dot(ws[c], xs[r])` for up to [`ROWS`] activation rows and [`COLS`] weight rows.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI (and AVX2, FMA, F16C); `kind` any quantized format; `ws`
/// holds 1–[`COLS`] rows and `xs` 1–[`ROWS`]; every `ws[c]` holds `nb` whole blocks of `kind` and every
/// `xs[r]` at least `nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot_tile(
    kind: QuantKind,
    ws: &[&[u8]],
    xs: &[&[Q8Block]],
    out: &mut [[f32; COLS]; ROWS],
) {
    // The shapes `qdot::dot_tile` asserts for AVX2; here the caller's (`matmul_q8` builds them).
    debug_assert!(
        (1..=ROWS).contains(&xs.len())
            && (1..=COLS).contains(&ws.len())
            && ws.iter().all(|w| w.len() == ws[0].len())
            && ws[0].len().is_multiple_of(kind.block_bytes())
            && xs
                .iter()
                .all(|x| x.len() >= ws[0].len() / kind.block_bytes() * kind.block_elems() / 32),
        "dot_tile shapes"
    );
    tile_dispatch!(
        tile,
        kind,
        [Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q6K],
        ws,
        xs,
        out,
        [1, 2, 3],
        4
    )
}

/// Two 256-bit halves as one register (`hi` in lanes 8–15).
///
/// # Safety
/// AVX-512F must be available.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    // SAFETY: register-only AVX-512F intrinsics; AVX-512F is available (our contract).
    unsafe { _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1) }
}

/// Two scalars spread over the halves of a register.
///
/// # Safety
/// AVX-512F must be available.
#[inline(always)]
unsafe fn join_ps(lo: f32, hi: f32) -> __m512 {
    // SAFETY: register-only AVX-512F and AVX intrinsics; both are available (our contract).
    unsafe {
        let lo = _mm512_castps_pd(_mm512_set1_ps(lo));
        _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_set1_ps(hi)), 1))
    }
}

/// The 16 lanes summed in a fixed tree (halves, then the AVX2 tree).
///
/// # Safety
/// AVX-512F and AVX2 must be available.
#[inline(always)]
unsafe fn hsum16(v: __m512) -> f32 {
    use crate::cpu::simd::{Avx2, Simd};
    // SAFETY: register-only AVX-512F and AVX intrinsics, and `Avx2::hsum`, which needs AVX; all are
    // available (our contract).
    unsafe {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
        Avx2::hsum(_mm256_add_ps(lo, hi))
    }
}

/// `R` activation rows against `C` weight rows of format `K`.
///
/// # Safety
/// The extensions of [`dot_tile`] must be available; with `nb = ws[0].len() / code_block_bytes(K)`,
/// every `ws[c]` (`c < C`) holds at least `nb` blocks of format `K` and every `xs[r]` (`r < R`) at least
/// `nb · code_units(K)` blocks (`ws` and `xs` themselves are indexed with bounds checks).
#[inline(always)]
unsafe fn tile<const K: u8, const R: usize, const C: usize>(
    ws: &[&[u8]],
    xs: &[&[Q8Block]],
) -> [[f32; C]; R] {
    let units = ws[0].len() / code_block_bytes(K) * code_units(K);
    // SAFETY: `pair` gets units `u` and `u + 1` only while `u + 2 ≤ units`, and unit `u < units` alone
    // otherwise, within the `units` of every row (our contract); the extensions are ours too.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut extra = [[0.0f32; C]; R];
        let mut u = 0;
        while u + 2 <= units {
            pair::<K, R, C, true>(ws, xs, u, &mut acc, &mut extra);
            u += 2;
        }
        if u < units {
            // An odd last block pairs with zeros (weights and scales), which add exactly nothing.
            pair::<K, R, C, false>(ws, xs, u, &mut acc, &mut extra);
        }
        let mut out = [[0.0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = hsum16(acc[r][c]) + extra[r][c];
            }
        }
        out
    }
}

/// Units `u` and `u + 1` (only `u` when not `TWO`; units of 32 values, as in `qdot`: a block, or a
/// sub-block of Q4_K/Q6_K, whose 8 units per block keep a pair within one block) of every row and column
/// of the tile.
///
/// # Safety
/// The extensions of [`dot_tile`] must be available; unit `u` (and `u + 1` when `TWO`) exists in every
/// `ws[c]` (`c < C`, format `K`) and every `xs[r]` (`r < R`).
#[inline(always)]
unsafe fn pair<const K: u8, const R: usize, const C: usize, const TWO: bool>(
    ws: &[&[u8]],
    xs: &[&[Q8Block]],
    u: usize,
    acc: &mut [[__m512; C]; R],
    extra: &mut [[f32; C]; R],
) {
    let (bb, per) = (code_block_bytes(K), code_units(K));
    // SAFETY: by our contract unit `v` (`u`, and `u + 1` with `TWO`) of `ws[c]` lies in the whole block
    // at `ws[c] + (v / per)·bb`, which `unit` reads within (its `# Safety`, `v % per < per`);
    // `x = xs[r] + u` (and `x + 1` with `TWO`) are existing, aligned elements of a `&[Q8Block]`, so the
    // references `&*x` are valid, and their `qs` are read unaligned; the extensions are ours.
    unsafe {
        let zero = _mm512_setzero_si512();
        let top = _mm512_set1_epi8(-128);
        let mut wv = [zero; C];
        let mut init = [zero; C];
        let mut dw = [_mm512_setzero_ps(); C];
        let mut m = [[0.0f32; 2]; C];
        for c in 0..C {
            let at = |v: usize| ws[c].as_ptr().add(v / per * bb);
            let (w0, d0, m0, mul0) = unit::<K>(at(u), u % per);
            let (w1, d1, m1, mul1) = if TWO {
                unit::<K>(at(u + 1), (u + 1) % per)
            } else {
                (_mm256_setzero_si256(), 0.0, 0.0, _mm256_setzero_si256())
            };
            wv[c] = join(w0, w1);
            dw[c] = if K == Q6K {
                // Each 32-bit lane of a `vpdpbusd` sum covers 4 values, so lanes 0–3 and 4–7 of a
                // unit are its two 16-value sub-blocks: their scales go into the float scale.
                let lo = |mul: __m256i| _mm256_extract_epi16::<0>(mul) as i16 as f32;
                let hi = |mul: __m256i| _mm256_extract_epi16::<8>(mul) as i16 as f32;
                let (a0, b0) = (d0 * lo(mul0), d0 * hi(mul0));
                let (a1, b1) = (d1 * lo(mul1), d1 * hi(mul1));
                _mm512_setr_ps(a0, a0, a0, a0, b0, b0, b0, b0, a1, a1, a1, a1, b1, b1, b1, b1)
            } else {
                join_ps(d0, d1)
            };
            if !code_signed(K) {
                m[c] = [m0, m1];
            } else {
                // −128 · Σw per lane: undoes the activations' +128 offset.
                init[c] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, top, wv[c]));
            }
        }
        for r in 0..R {
            let x = xs[r].as_ptr().add(u);
            let x0 = &*x;
            let lo = _mm256_loadu_si256(x0.qs.as_ptr().cast());
            let (hi, d1, s1) = if TWO {
                let x1 = &*x.add(1);
                (_mm256_loadu_si256(x1.qs.as_ptr().cast()), x1.d, x1.s)
            } else {
                (_mm256_setzero_si256(), 0.0, 0.0)
            };
            let xv = join(lo, hi);
            let xu = _mm512_xor_si512(xv, top);
            let dx = join_ps(x0.d, d1);
            for c in 0..C {
                let isum = if !code_signed(K) {
                    _mm512_dpbusd_epi32(zero, wv[c], xv)
                } else {
                    _mm512_dpbusd_epi32(init[c], xu, wv[c])
                };
                let dd = _mm512_mul_ps(dw[c], dx);
                acc[r][c] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(isum), acc[r][c]);
                if !code_signed(K) {
                    extra[r][c] += m[c][0] * x0.s;
                    if TWO {
                        extra[r][c] += m[c][1] * s1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::qdot::{dot_tile as dot_tile_avx2, quantize_rows, tests::q4_1_row};
    use crate::cpu::simd::Isa;
    use crate::cpu::test_data::lcg;
    use crate::quant::{quantize_q4_0, quantize_q8_0};

    #[test]
    fn tiles_match_avx2_and_each_output_is_independent_of_the_tile() {
        if Isa::detect() != Isa::Avx512 {
            return;
        }
        for kind in QuantKind::ALL {
            // 9 blocks of 32 (an odd count exercises the zero-padded last pair), 2 of 256.
            let k = if kind.block_elems() == 256 { 512 } else { 288 };
            let rows: Vec<f32> = lcg(20, 4 * k);
            let q = quantize_rows(&rows, 4, k);
            let xs: Vec<&[Q8Block]> = q.chunks(k / 32).collect();
            let nb = k / kind.block_elems();
            let ws: Vec<Vec<u8>> = (0..4)
                .map(|c| match kind {
                    QuantKind::Q8_0 => quantize_q8_0(&lcg(30 + c, k)),
                    QuantKind::Q4_0 => quantize_q4_0(&lcg(30 + c, k)),
                    QuantKind::Q4_1 => q4_1_row(30 + c, k),
                    _ => crate::quant::test_blocks::blocks(kind, 4 * nb)
                        [c as usize * nb * kind.block_bytes()..][..nb * kind.block_bytes()]
                        .to_vec(),
                })
                .collect();
            let wrefs: Vec<&[u8]> = ws.iter().map(|w| w.as_slice()).collect();
            let mut full = [[0.0f32; COLS]; ROWS];
            // SAFETY: AVX-512 VNNI detected; whole blocks.
            unsafe { dot_tile(kind, &wrefs, &xs, &mut full) };
            for r in 0..4 {
                for c in 0..4 {
                    // The integer sums are AVX2's; only the order of the f32 sum differs.
                    let mut two = [[0.0f32; 2]; 4];
                    dot_tile_avx2(kind, &wrefs[c..c + 1], &xs[r..r + 1], &mut two);
                    let scale = two[0][0].abs().max(1.0);
                    assert!(
                        (full[r][c] - two[0][0]).abs() <= 1e-5 * scale,
                        "{kind:?} [{r},{c}]: {} vs AVX2 {}",
                        full[r][c],
                        two[0][0]
                    );
                    for (nr, nc) in [(1, 1), (2, 3), (3, 2)] {
                        let (r0, c0) = (r.min(4 - nr), c.min(4 - nc));
                        let mut part = [[0.0f32; COLS]; ROWS];
                        // SAFETY: as above.
                        unsafe { dot_tile(kind, &wrefs[c0..c0 + nc], &xs[r0..r0 + nr], &mut part) };
                        assert_eq!(
                            part[r - r0][c - c0].to_bits(),
                            full[r][c].to_bits(),
                            "{kind:?} [{r},{c}] in a {nr}x{nc} tile"
                        );
                    }
                }
            }
        }
    }
}
