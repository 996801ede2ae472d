//! The AVX-512 BF16 tiles of [`super`]: up to 8 rows × 3 panels (24 accumulators), wider when few
//! rows remain, one `vdpbf16ps` per row, panel and input pair.

use super::Line;
use super::NR;
use std::arch::x86_64::*;

/// Most rows per tile.
pub(super) const MR: usize = 8;

/// Most panels per tile (the one-row tile's).
pub(super) const MP: usize = 8;

/// How far ahead in a panel the tiles prefetch (as the float tiles: the first row tile streams the
/// panel from memory).
const PREFETCH_BYTES: usize = 2048;

/// Panels per tile for `rows` rows: as many as the 32 registers hold beside the weights.
pub(super) fn panels_for(rows: usize) -> usize {
    match rows {
        7.. => 3,
        4..=6 => 4,
        3 => 6,
        _ => 8,
    }
}

/// `x` rounded to bf16 (to nearest even), two per `u32` (the even input in the low half), the odd
/// tail padded with zero.
///
/// # Safety
/// AVX-512 F/BW/VL and BF16 must be available; `dst.len() == x.len().div_ceil(2)`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn to_bf16_pairs(x: &[f32], dst: &mut [u32]) {
    debug_assert_eq!(dst.len(), x.len().div_ceil(2));
    let mut i = 0;
    // SAFETY: each full step reads `x[i..i + 32]` and writes `dst[i / 2..i / 2 + 16]` (both in bounds
    // by the loop condition and `dst`'s length); the tail uses masked loads and stores of the
    // remaining `x.len() − i` values and `⌈(x.len() − i) / 2⌉` pairs; the extensions are enabled.
    unsafe {
        while i + 32 <= x.len() {
            let lo = _mm512_loadu_ps(x.as_ptr().add(i));
            let hi = _mm512_loadu_ps(x.as_ptr().add(i + 16));
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(dst.as_mut_ptr().add(i / 2).cast(), v);
            i += 32;
        }
        if i < x.len() {
            let left = x.len() - i;
            // Masks of the `left < 32` values: the low 16 and the high ones.
            let m_lo = ((1u32 << left.min(16)) - 1) as __mmask16;
            let m_hi = ((1u32 << left.saturating_sub(16)) - 1) as __mmask16;
            let lo = _mm512_maskz_loadu_ps(m_lo, x.as_ptr().add(i));
            let hi = _mm512_maskz_loadu_ps(m_hi, x.as_ptr().add((i + 16).min(x.len())));
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            let m_out = ((1u32 << left.div_ceil(2)) - 1) as u16;
            _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(i / 2).cast(), m_out, v);
        }
    }
}

/// `rows` rows (`1..=MR`) of `xs` against `np` (`1..=panels_for(rows)`) panels of `ws`, each of
/// `pairs` lines, into `acc[row][panel]`.
///
/// # Safety
/// AVX-512 F/BW/VL and BF16 must be available; `xs.len() ≥ rows · pairs`, `ws.len() ≥ np · pairs`.
pub(super) unsafe fn tile(
    rows: usize,
    np: usize,
    pairs: usize,
    xs: &[u32],
    ws: &[Line],
    acc: &mut [[[f32; NR]; MP]; MR],
) {
    debug_assert!(xs.len() >= rows * pairs && ws.len() >= np * pairs);
    macro_rules! go {
        ($r:literal, $($p:literal)+) => {
            match np {
                // SAFETY: `R = rows` and `P = np` (the arms), the rest is our contract.
                $($p => unsafe { run::<$r, $p>(pairs, xs, ws, acc) },)+
                _ => unreachable!("{np} panels for {} rows", $r),
            }
        };
    }
    match rows {
        8 => go!(8, 1 2 3),
        7 => go!(7, 1 2 3),
        6 => go!(6, 1 2 3 4),
        5 => go!(5, 1 2 3 4),
        4 => go!(4, 1 2 3 4),
        3 => go!(3, 1 2 3 4 5 6),
        2 => go!(2, 1 2 3 4 5 6 7 8),
        _ => go!(1, 1 2 3 4 5 6 7 8),
    }
}

/// `R` rows against `P` panels.
///
/// # Safety
/// As for [`tile`], with `rows = R`, `np = P`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn run<const R: usize, const P: usize>(
    pairs: usize,
    xs: &[u32],
    ws: &[Line],
    acc: &mut [[[f32; NR]; MP]; MR],
) {
    // SAFETY: line `p · pairs + t` (`p < P`, `t < pairs`) is inside `ws` and pair `r · pairs + t`
    // (`r < R`) inside `xs` (our contract); the prefetch is a hint that never faults (its address is
    // formed with `wrapping_add`); the stores go to the local `acc`; the extensions are enabled.
    unsafe {
        let (x, w) = (xs.as_ptr(), ws.as_ptr());
        let mut a = [[_mm512_setzero_ps(); P]; R];
        for t in 0..pairs {
            let mut wv = [_mm512_setzero_si512(); P];
            for (p, v) in wv.iter_mut().enumerate() {
                let line = w.add(p * pairs + t);
                _mm_prefetch::<_MM_HINT_T0>(line.cast::<i8>().wrapping_add(PREFETCH_BYTES));
                *v = _mm512_load_si512(line.cast());
            }
            for (r, row) in a.iter_mut().enumerate() {
                let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32(*x.add(r * pairs + t) as i32));
                for (s, v) in row.iter_mut().zip(&wv) {
                    *s = _mm512_dpbf16_ps(*s, xv, std::mem::transmute::<__m512i, __m512bh>(*v));
                }
            }
        }
        for (r, row) in a.iter().enumerate() {
            for (p, v) in row.iter().enumerate() {
                _mm512_storeu_ps(acc[r][p].as_mut_ptr(), *v);
            }
        }
    }
}
