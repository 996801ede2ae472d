//! AVX-512 VNNI integer dot products for Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 weights against 8-bit activation blocks
//! ([`super::qdot::Q8Block`]): two blocks of 32 per 512-bit register, one `vpdpbusd` (unsigned × signed
//! bytes, four products summed per 32-bit lane) per pair of blocks, against `maddubs` + `madd` + a sign
//! fix-up per block with AVX2. Tiles of up to 4 activation rows × 4 weight rows share every load; the
//! matmul uses 4 × 4 (measured 10–20% faster than 4 × 2 on 16- and 64-row products) and 1 × 2 for a
//! single row.
//!
//! `vpdpbusd` multiplies an unsigned operand by a signed one. Q4_1 and Q5_1 weights are unsigned, so they
//! go in as they are. For the signed formats (Q8_0, Q4_0, Q5_0) the activations are offset to unsigned
//! (`x + 128`, a flip of the top bit) and the excess `128 · Σw` — computed once per weight block pair
//! with the same instruction — starts the accumulator negated: the integer sums are exact either way.
//!
//! Invariants: each output is the same sequence whatever the tile: per pair of blocks, the exact
//! integer sums (lanes 0–7 the even block, 8–15 the odd one), converted to f32 and fused into a 16-lane
//! accumulator with the scale `d_w · d_x`; then a fixed 16-lane sum, plus (Q4_1, Q5_1) the minimums' term
//! `Σ m · s` added block by block. So batch invariance holds; the result differs from the AVX2 path in
//! summation order only (the integer sums are identical).

use super::qdot::avx2::{f16_at, unit};
use super::qdot::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8Block, code_block_bytes, code_signed, tile_dispatch};
use crate::quant::QuantKind;
use std::arch::x86_64::*;

/// Largest tile.
pub(crate) const ROWS: usize = 4;
/// Largest tile.
pub(crate) const COLS: usize = 4;

/// `out[r][c] = dot(ws[c], xs[r])` for up to [`ROWS`] activation rows and [`COLS`] weight rows.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI (and AVX2, FMA, F16C); `kind` is one [`supports`]; `ws`
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
        supports(kind)
            && (1..=ROWS).contains(&xs.len())
            && (1..=COLS).contains(&ws.len())
            && ws.iter().all(|w| w.len() == ws[0].len())
            && ws[0].len().is_multiple_of(kind.block_bytes())
            && xs.iter().all(|x| x.len() >= ws[0].len() / kind.block_bytes()),
        "dot_tile shapes"
    );
    tile_dispatch!(
        tile,
        kind,
        [Q8_0, Q4_0, Q4_1, Q5_0, Q5_1],
        ws,
        xs,
        out,
        [1, 2, 3],
        4
    )
}

/// Weight values of one block as 32 bytes in element order: signed for Q8_0/Q4_0/Q5_0, unsigned for
/// Q4_1/Q5_1 (the AVX2 tiles' decoding; its scale and minimum are read by the caller).
///
/// # Safety
/// `p` points to a whole readable block of format `K` (`code_block_bytes(K)` bytes), one of the
/// 32-value formats; AVX2 and F16C available.
#[inline(always)]
unsafe fn wblock<const K: u8>(p: *const u8) -> __m256i {
    // SAFETY: `unit`'s contract is ours (a whole block, unit 0 of a 32-value format, AVX2/F16C).
    unsafe { unit::<K>(p, 0).0 }
}

/// Whether [`dot_tile`] handles `kind` (the other integer formats take `super::qdot`'s AVX2 tiles).
pub(crate) fn supports(kind: QuantKind) -> bool {
    matches!(
        kind,
        QuantKind::Q8_0 | QuantKind::Q4_0 | QuantKind::Q4_1 | QuantKind::Q5_0 | QuantKind::Q5_1
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
/// `nb` blocks (`ws` and `xs` themselves are indexed with bounds checks).
#[inline(always)]
unsafe fn tile<const K: u8, const R: usize, const C: usize>(
    ws: &[&[u8]],
    xs: &[&[Q8Block]],
) -> [[f32; C]; R] {
    let nb = ws[0].len() / code_block_bytes(K);
    // SAFETY: `pair` gets blocks `b` and `b + 1` only while `b + 2 ≤ nb`, and block `b < nb` alone
    // otherwise, within the `nb` blocks of every row (our contract); the extensions are ours too.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut extra = [[0.0f32; C]; R];
        let mut b = 0;
        while b + 2 <= nb {
            pair::<K, R, C, true>(ws, xs, b, &mut acc, &mut extra);
            b += 2;
        }
        if b < nb {
            // An odd last block pairs with zeros (weights and scales), which add exactly nothing.
            pair::<K, R, C, false>(ws, xs, b, &mut acc, &mut extra);
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

/// Blocks `b` and `b + 1` (only `b` when not `TWO`) of every row and column of the tile.
///
/// # Safety
/// The extensions of [`dot_tile`] must be available; block `b` (and `b + 1` when `TWO`) exists in every
/// `ws[c]` (`c < C`, format `K`) and every `xs[r]` (`r < R`).
#[inline(always)]
unsafe fn pair<const K: u8, const R: usize, const C: usize, const TWO: bool>(
    ws: &[&[u8]],
    xs: &[&[Q8Block]],
    b: usize,
    acc: &mut [[__m512; C]; R],
    extra: &mut [[f32; C]; R],
) {
    let bb = code_block_bytes(K);
    // SAFETY: by our contract `p = ws[c] + b·bb` starts block `b`, and with `TWO` block `b + 1` follows
    // at `p + bb`, so `wblock` and the f16 reads (offsets 0..4 of a block) stay inside whole blocks;
    // `x = xs[r] + b` (and `x + 1` with `TWO`) are existing, aligned elements of a `&[Q8Block]`, so
    // the references `&*x` are valid, and their `qs` are read unaligned; the extensions are ours.
    unsafe {
        let zero = _mm512_setzero_si512();
        let top = _mm512_set1_epi8(-128);
        let mut wv = [zero; C];
        let mut init = [zero; C];
        let mut dw = [_mm512_setzero_ps(); C];
        let mut m = [[0.0f32; 2]; C];
        for c in 0..C {
            let p = ws[c].as_ptr().add(b * bb);
            let hi = if TWO {
                wblock::<K>(p.add(bb))
            } else {
                _mm256_setzero_si256()
            };
            wv[c] = join(wblock::<K>(p), hi);
            dw[c] = join_ps(f16_at(p), if TWO { f16_at(p.add(bb)) } else { 0.0 });
            if !code_signed(K) {
                m[c] = [f16_at(p.add(2)), if TWO { f16_at(p.add(bb + 2)) } else { 0.0 }];
            } else {
                // −128 · Σw per lane: undoes the activations' +128 offset.
                init[c] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, top, wv[c]));
            }
        }
        for r in 0..R {
            let x = xs[r].as_ptr().add(b);
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
        // 9 blocks: an odd count exercises the zero-padded last pair.
        let k = 288;
        let rows: Vec<f32> = lcg(20, 4 * k);
        let q = quantize_rows(&rows, 4, k);
        let xs: Vec<&[Q8Block]> = q.chunks(k / 32).collect();
        for kind in [
            QuantKind::Q8_0,
            QuantKind::Q4_0,
            QuantKind::Q4_1,
            QuantKind::Q5_0,
            QuantKind::Q5_1,
        ] {
            let ws: Vec<Vec<u8>> = (0..4)
                .map(|c| match kind {
                    QuantKind::Q8_0 => quantize_q8_0(&lcg(30 + c, k)),
                    QuantKind::Q4_0 => quantize_q4_0(&lcg(30 + c, k)),
                    QuantKind::Q4_1 => q4_1_row(30 + c, k),
                    _ => crate::quant::test_blocks::blocks(kind, 4 * k / 32)
                        [c as usize * 9 * kind.block_bytes()..][..9 * kind.block_bytes()]
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
