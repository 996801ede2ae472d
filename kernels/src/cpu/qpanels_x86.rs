//! The AVX-512 VNNI tiles of the integer panels ([`super`]): how each format's unit is read (its
//! scales, minimums and 64-byte groups), the `R × P` tile that multiplies them (up to 6 rows × 2
//! panels, or 1 × 4), and how a product's rows are cut into tiles.

use super::{
    Format, NR, Nib, Q4_0, Q4_1, Q4K_M, Q4K_SC, Q4K_VALUES, Q4k, Q5, Q5_1, Q6K_SC, Q6K_VALUES, Q6k, Q8,
};
use crate::cpu::qdot::Q8Block;
use crate::quant::QuantKind;
use std::arch::x86_64::*;

/// One unit of a chunk as the tile reads it.
pub(super) struct UnitRef {
    /// The 16 rows' scales `d_w` of values 0–15 and 16–31 (the same but for split formats).
    scale: [__m512; 2],
    /// The 16 rows' minimums (zero without).
    min: __m512,
    /// Where its groups are read from.
    values: *const u8,
}

/// How the tile reads one unit of 32 values of a chunk.
pub(super) trait Unit: Format {
    /// Whether the format has minimums (`acc −= min · s_x` per unit).
    const HAS_MIN: bool;
    /// Whether values 0–15 and 16–31 have their own scales (two sums a unit).
    const SPLIT: bool;
    /// Unit `i` of the chunk at `chunk`.
    ///
    /// # Safety
    /// AVX-512 F/BW and F16C available; `chunk` points at [`Format::CHUNK`] readable bytes; `i <
    /// UNITS`.
    unsafe fn unit(chunk: *const u8, i: usize) -> UnitRef;
    /// Group `g` of unit `i`, whose values [`Unit::unit`] located at `values`.
    ///
    /// # Safety
    /// AVX-512 F/BW available; `values` from [`Unit::unit`] for unit `i`; `g < 8`.
    unsafe fn group(values: *const u8, i: usize, g: usize) -> __m512i;
}

impl Unit for Q8 {
    const HAS_MIN: bool = false;
    const SPLIT: bool = false;
    #[inline(always)]
    unsafe fn unit(chunk: *const u8, i: usize) -> UnitRef {
        // SAFETY: block `i < 2`'s scales at 32 · i and values at 64 + 512 · i lie in the chunk.
        unsafe {
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(chunk.add(32 * i).cast()));
            UnitRef {
                scale: [dw; 2],
                min: _mm512_setzero_ps(),
                values: chunk.add(64 + 512 * i),
            }
        }
    }
    #[inline(always)]
    unsafe fn group(values: *const u8, _: usize, g: usize) -> __m512i {
        // SAFETY: group `g < 8` lies within the block's 512 value bytes (our contract).
        unsafe { _mm512_loadu_si512(values.add(g * 64).cast()) }
    }
}

impl<const MIN: bool, const FIFTH: bool> Unit for Nib<MIN, FIFTH> {
    const HAS_MIN: bool = MIN;
    const SPLIT: bool = false;
    #[inline(always)]
    unsafe fn unit(chunk: *const u8, i: usize) -> UnitRef {
        // SAFETY: block `i < 2`'s scales at 32 · i, minimums at 64 + 32 · i (with `MIN`) and
        // values at `HEAD + VALUES · i` lie in the chunk.
        unsafe {
            let half = |at: usize| _mm512_cvtph_ps(_mm256_loadu_si256(chunk.add(at).cast()));
            let dw = half(32 * i);
            // `acc −= min · s_x` in the tile; these formats add their minimum.
            let min = if MIN {
                _mm512_sub_ps(_mm512_setzero_ps(), half(64 + 32 * i))
            } else {
                _mm512_setzero_ps()
            };
            UnitRef {
                scale: [dw; 2],
                min,
                values: chunk.add(Self::HEAD + Self::VALUES * i),
            }
        }
    }
    #[inline(always)]
    unsafe fn group(values: *const u8, _: usize, g: usize) -> __m512i {
        // SAFETY: nibble vector `g % 4` and (with `FIFTH`) the fifth-bit vector at 256 lie within
        // the block's value bytes (our contract); the rest is register arithmetic (AVX-512 F/BW).
        unsafe {
            let n = _mm512_loadu_si512(values.add((g % 4) * 64).cast());
            let n = if g < 4 { n } else { _mm512_srli_epi16::<4>(n) };
            let low = _mm512_and_si512(n, _mm512_set1_epi8(0x0F));
            if !FIFTH {
                return low;
            }
            let h = _mm512_and_si512(
                _mm512_loadu_si512(values.add(256).cast()),
                _mm512_set1_epi32(0x0101_0101 << g),
            );
            // Bit `8i + g` to bit `8i + 4`: the fifth bit of each byte's value.
            let h = if g <= 4 {
                _mm512_sll_epi32(h, _mm_cvtsi32_si128(4 - g as i32))
            } else {
                _mm512_srl_epi32(h, _mm_cvtsi32_si128(g as i32 - 4))
            };
            _mm512_or_si512(low, h)
        }
    }
}

impl Unit for Q4k {
    const HAS_MIN: bool = true;
    const SPLIT: bool = false;
    #[inline(always)]
    unsafe fn unit(chunk: *const u8, i: usize) -> UnitRef {
        // SAFETY: `d` at 0, `dmin` at 32, unit `i < 8`'s scales and minimums (16 bytes each) and
        // its pair's values at `Q4K_VALUES + 512 · (i / 2)` lie in the chunk.
        unsafe {
            let bytes =
                |at: usize| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(chunk.add(at).cast())));
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(chunk.cast()));
            let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(chunk.add(32).cast()));
            let dw = _mm512_mul_ps(d, bytes(Q4K_SC + 16 * i));
            UnitRef {
                scale: [dw; 2],
                min: _mm512_mul_ps(dmin, bytes(Q4K_M + 16 * i)),
                values: chunk.add(Q4K_VALUES + 512 * (i / 2)),
            }
        }
    }
    #[inline(always)]
    unsafe fn group(values: *const u8, i: usize, g: usize) -> __m512i {
        // SAFETY: vector `g < 8` of the unit pair's 512 value bytes (our contract); the even unit
        // takes the low nibbles, the odd one the high ones.
        unsafe {
            let n = _mm512_loadu_si512(values.add(g * 64).cast());
            let n = if i.is_multiple_of(2) {
                n
            } else {
                _mm512_srli_epi16::<4>(n)
            };
            _mm512_and_si512(n, _mm512_set1_epi8(0x0F))
        }
    }
}

impl Unit for Q6k {
    const HAS_MIN: bool = false;
    const SPLIT: bool = true;
    #[inline(always)]
    unsafe fn unit(chunk: *const u8, i: usize) -> UnitRef {
        // SAFETY: `d` at 0, unit `i < 8`'s two scale vectors (16 bytes each) at `Q6K_SC + 32 · i`
        // and its 512 value bytes at `Q6K_VALUES + 512 · i` lie in the chunk.
        unsafe {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(chunk.cast()));
            let sc =
                |at: usize| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(chunk.add(at).cast())));
            UnitRef {
                scale: [
                    _mm512_mul_ps(d, sc(Q6K_SC + 32 * i)),
                    _mm512_mul_ps(d, sc(Q6K_SC + 32 * i + 16)),
                ],
                min: _mm512_setzero_ps(),
                values: chunk.add(Q6K_VALUES + 512 * i),
            }
        }
    }
    #[inline(always)]
    unsafe fn group(values: *const u8, _: usize, g: usize) -> __m512i {
        // SAFETY: group `g < 8` lies within the unit's 512 value bytes (our contract).
        unsafe { _mm512_loadu_si512(values.add(g * 64).cast()) }
    }
}

/// Most activation rows one tile takes: a verification step's 1 + k rows (k ≤ 5) go through the
/// weights in one pass, each 64-byte group loaded and decoded once for all of them. (Tiles of 7 or
/// 8 rows fit the registers only with one panel, which measured slower than two passes of 4.)
pub(super) const MR: usize = 6;
/// Most panels one tile takes (the one-row tile's).
pub(super) const MP: usize = 4;
/// How far ahead in each panel the tiles prefetch.
const PREFETCH_BYTES: usize = 2048;

/// Panels per tile for `rows` rows: as many as the 32 registers hold beside each (row, panel)'s
/// integer and float accumulators, the weight groups and the broadcast activations.
pub(super) fn panels_for(rows: usize) -> usize {
    if rows == 1 { 4 } else { 2 }
}

/// The row tiles of a product of `rows` rows, as (first row, rows): up to 4 × [`MR`] rows, as few
/// near-equal tiles of at most [`MR`] as cover them (a verification step of up to 11 drafts in two
/// passes over the weights; four sequences verifying 4 drafts each, 20 rows, in four passes of 5
/// rather than five of 4), else tiles of 4 (prefill: the panels per task stay in L2 while each tile
/// passes).
pub(super) fn row_tiles(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let size = if rows <= 4 * MR {
        rows.div_ceil(rows.div_ceil(MR).max(1))
    } else {
        4
    };
    (0..rows.div_ceil(size.max(1))).map(move |t| (t * size, size.min(rows - t * size)))
}

/// One tile's operands: `np` panels of `pb` bytes (`nb` blocks of `kind` each) at `ws`, and the
/// tile's activation rows' blocks `xs` and their sums `ss` (`nb` per row).
pub(super) struct TileArgs<'a> {
    pub kind: QuantKind,
    pub nb: usize,
    pub pb: usize,
    pub ws: &'a [u8],
    pub xs: &'a [Q8Block],
    pub ss: &'a [[i32; 2]],
}

/// [`tile`] for `a.kind`, `rows` (1–[`MR`]) activation rows and `np` (1–[`panels_for`]`(rows)`)
/// panels.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C available; `a.ws` holds `np` panels of `a.pb` bytes with `a.nb`
/// blocks of `a.kind` each; `a.xs` and `a.ss` hold `rows · a.nb` blocks and sums.
pub(super) unsafe fn tile_dispatch(
    a: &TileArgs<'_>,
    rows: usize,
    np: usize,
    acc: &mut [[[f32; NR]; MP]; MR],
) {
    let (nb, pb) = (a.nb, a.pb);
    debug_assert!(a.ws.len() >= np * pb && a.xs.len() >= rows * nb && a.ss.len() >= rows * nb);
    debug_assert!((1..=MR).contains(&rows) && (1..=panels_for(rows)).contains(&np));
    macro_rules! go {
        ($f:ty, $r:literal, $p:literal) => {
            // SAFETY: our contract, with `$f` the format of `kind`, `$r == rows`, `$p == np`.
            unsafe { tile::<$f, $r, $p>(nb, pb, a.ws.as_ptr(), a.xs, a.ss, acc) }
        };
    }
    macro_rules! shapes {
        ($f:ty) => {
            match (rows, np) {
                (1, 1) => go!($f, 1, 1),
                (1, 2) => go!($f, 1, 2),
                (1, 3) => go!($f, 1, 3),
                (1, _) => go!($f, 1, 4),
                (2, 1) => go!($f, 2, 1),
                (2, _) => go!($f, 2, 2),
                (3, 1) => go!($f, 3, 1),
                (3, _) => go!($f, 3, 2),
                (4, 1) => go!($f, 4, 1),
                (4, _) => go!($f, 4, 2),
                (5, 1) => go!($f, 5, 1),
                (5, _) => go!($f, 5, 2),
                (6, 1) => go!($f, 6, 1),
                _ => go!($f, 6, 2),
            }
        };
    }
    match a.kind {
        QuantKind::Q8_0 => shapes!(Q8),
        QuantKind::Q4_0 => shapes!(Q4_0),
        QuantKind::Q4_1 => shapes!(Q4_1),
        QuantKind::Q5_0 => shapes!(Q5),
        QuantKind::Q5_1 => shapes!(Q5_1),
        QuantKind::Q4K => shapes!(Q4k),
        _ => shapes!(Q6k),
    }
}

/// `R` activation rows against `P` panels, every block (see the module header).
///
/// # Safety
/// As for [`tile_dispatch`] with `F` the format, `R == rows`, `P == np`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<F: Unit, const R: usize, const P: usize>(
    nb: usize,
    pb: usize,
    ws: *const u8,
    xs: &[Q8Block],
    ss: &[[i32; 2]],
    out: &mut [[[f32; NR]; MP]; MR],
) {
    let mut facc = [[_mm512_setzero_ps(); P]; R];
    // One sum a unit, or (split formats) one per half: groups 0–3 and 4–7.
    let halves = if F::SPLIT { 2 } else { 1 };
    for u in 0..nb {
        let (c, i) = (u / F::UNITS, u % F::UNITS);
        if i == 0 {
            // Each panel's stream, PREFETCH_BYTES ahead: the hardware prefetchers lag the P streams
            // (a hint: the address may run past the panel, it never faults).
            for q in 0..P {
                let ahead = ws.wrapping_add(q * pb + c * F::CHUNK + PREFETCH_BYTES);
                for off in (0..F::CHUNK).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off).cast());
                }
            }
        }
        // SAFETY: panel `q < P`'s chunk `c` lies within `ws` (our contract: `nb` units a panel).
        let units: [UnitRef; P] =
            std::array::from_fn(|q| unsafe { F::unit(ws.add(q * pb + c * F::CHUNK), i) });
        let x: [&Q8Block; R] = std::array::from_fn(|r| &xs[r * nb + u]);
        for h in 0..halves {
            let sum = |r: usize| {
                if F::SPLIT {
                    ss[r * nb + u][h]
                } else {
                    ss[r * nb + u][0] + ss[r * nb + u][1]
                }
            };
            let mut iacc: [[__m512i; P]; R] =
                std::array::from_fn(|r| [_mm512_set1_epi32(-F::OFFSET * sum(r)); P]);
            for g in h * 8 / halves..(h + 1) * 8 / halves {
                // SAFETY: each unit's values located by `F::unit` (above); `g < 8`.
                let wv: [__m512i; P] = std::array::from_fn(|q| unsafe { F::group(units[q].values, i, g) });
                for r in 0..R {
                    let q4 = &x[r].qs[4 * g..4 * g + 4];
                    let xb = _mm512_set1_epi32(i32::from_le_bytes([
                        q4[0] as u8,
                        q4[1] as u8,
                        q4[2] as u8,
                        q4[3] as u8,
                    ]));
                    for q in 0..P {
                        iacc[r][q] = _mm512_dpbusd_epi32(iacc[r][q], wv[q], xb);
                    }
                }
            }
            for r in 0..R {
                let dx = _mm512_set1_ps(x[r].d);
                for q in 0..P {
                    let scale = _mm512_mul_ps(units[q].scale[h], dx);
                    facc[r][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[r][q]), scale, facc[r][q]);
                }
            }
        }
        if F::HAS_MIN {
            for r in 0..R {
                let s = _mm512_set1_ps(x[r].s);
                for q in 0..P {
                    facc[r][q] = _mm512_fnmadd_ps(units[q].min, s, facc[r][q]);
                }
            }
        }
    }
    for r in 0..R {
        for q in 0..P {
            // SAFETY: `out[r][q]` is 16 f32s.
            unsafe { _mm512_storeu_ps(out[r][q].as_mut_ptr(), facc[r][q]) };
        }
    }
}
