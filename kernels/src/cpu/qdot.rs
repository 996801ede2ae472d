//! Integer dot products for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q6_K weights (AVX2), as ggml's CPU
//! backend computes them:
//! each activation row is quantized once per matmul to 8-bit blocks of 32 (scale `d = max|x| / 127`,
//! values rounded to nearest), then every block's dot product is an exact integer sum
//! (`_mm256_maddubs_epi16` + `_mm256_madd_epi16`) scaled once by `d_w · d_x`. That is about half the
//! instructions of widening the weights to f32, which is what decode on a small model is bound by.
//!
//! Invariants: a row is quantized from its own values only, and an output element is the same fixed
//! sequence of operations over its weight row and activation row whatever the batch size or the tile
//! it lands in, so batch invariance holds; the integer sums are exact (no i16 saturation: |q4| ≤ 15
//! and |q8| ≤ 128 keep each pair ≤ 32,512); the arithmetic is ggml's AVX2 `vec_dot_q{4_0,4_1,8_0}_q8_{0,1}`
//! (Q4_0 weights offset by −8 before the signed product; Q4_1's minimum through the block's `s`).
//!
//! Every format is read in units of 32 weights, one per activation block: a whole block of the 32-weight
//! formats, a sub-block of Q4_K (its own 6-bit scale and minimum) or two 16-weight sub-blocks of Q6_K
//! (their two 8-bit scales applied to the pair sums by `madd` in place of ones). Q4_K and Q6_K differ
//! from ggml's there: ggml quantizes the activations in blocks of 256 (`block_q8_K`, one scale), we in
//! blocks of 32 (a finer scale, so no less accurate). |q5| ≤ 31 and |q6| ≤ 32 keep the i16 pair sums
//! exact as above.

use crate::quant::QuantKind;

/// One quantized block of 32 activations: ggml's `block_q8_1` (the scale and the scaled sum rounded to
/// f16, as ggml stores them, so products match llama.cpp's).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(8))]
pub(crate) struct Q8Block {
    /// Scale (an f16 value).
    pub d: f32,
    /// `d · Σ qs` (an f16 value), for the Q4_1 minimum.
    pub s: f32,
    /// Values.
    pub qs: [i8; 32],
}

/// Whether `isa` has the integer tiles ([`dot_tile`]; every quantized format has them).
pub(crate) fn supported(isa: super::simd::Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa.has_avx2()
}

/// Quantizes `rows` rows of `k` (a multiple of 32) activations into `k / 32` blocks each, with AVX2
/// (what [`dot_tile`] needs anyway) as ggml's x86 `quantize_row_q8_1` does: rounding to nearest even.
pub(crate) fn quantize_rows(x: &[f32], rows: usize, k: usize) -> Vec<Q8Block> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut out = vec![
            Q8Block {
                d: 0.0,
                s: 0.0,
                qs: [0; 32]
            };
            rows * k / 32
        ];
        debug_assert!(
            super::simd::Isa::Avx2.is_available(),
            "quantize_rows without AVX2"
        );
        // SAFETY: only called when `supported` (AVX2/F16C detected); `x` holds `rows * k` values.
        unsafe { avx2::quantize(&x[..rows * k], &mut out) };
        out
    }
    #[cfg(not(target_arch = "x86_64"))]
    quantize_rows_scalar(x, rows, k)
}

/// The scalar form of [`quantize_rows`] (the same arithmetic; tests, and targets without AVX2).
#[cfg(any(test, not(target_arch = "x86_64")))]
fn quantize_rows_scalar(x: &[f32], rows: usize, k: usize) -> Vec<Q8Block> {
    let mut out = Vec::with_capacity(rows * k / 32);
    for blk in x[..rows * k].chunks_exact(32) {
        let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut qs = [0i8; 32];
        let mut sum = 0i32;
        for (q, v) in qs.iter_mut().zip(blk) {
            *q = (v * id).round_ties_even() as i8;
            sum += *q as i32;
        }
        let f16 = |v: f32| half::f16::from_f32(v).to_f32();
        out.push(Q8Block {
            d: f16(d),
            s: f16(sum as f32 * d),
            qs,
        });
    }
    out
}

/// `out[r][c] = dot(ws[c], xs[r])` for up to 4 quantized activation rows and 2 weight rows (each
/// activation row holds at least the weight rows' block count).
pub(crate) fn dot_tile(kind: QuantKind, ws: &[&[u8]], xs: &[&[Q8Block]], out: &mut [[f32; 2]; 4]) {
    #[cfg(target_arch = "x86_64")]
    {
        let nb = ws.first().map_or(0, |w| w.len() / kind.block_bytes());
        debug_assert!(super::simd::Isa::Avx2.is_available(), "dot_tile without AVX2");
        let units = nb * kind.block_elems() / 32;
        assert!(
            (1..=4).contains(&xs.len())
                && (1..=2).contains(&ws.len())
                && ws.iter().all(|w| w.len() == nb * kind.block_bytes())
                && xs.iter().all(|x| x.len() >= units),
            "dot_tile shapes"
        );
        // SAFETY: callers check `supported` (AVX2 detected); lengths checked above.
        unsafe { avx2::dot_tile(kind, ws, xs, out) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "dot_tile without AVX2 ({kind:?}, {} rows, {})",
        xs.len(),
        out.len()
    )
}

/// Format codes for the const-generic integer tiles (AVX2 here, AVX-512 in `qdot_avx512`).
pub(super) const Q8_0: u8 = 0;
/// See [`Q8_0`].
pub(super) const Q4_0: u8 = 1;
/// See [`Q8_0`].
pub(super) const Q4_1: u8 = 2;
/// See [`Q8_0`].
pub(super) const Q5_0: u8 = 3;
/// See [`Q8_0`].
pub(super) const Q5_1: u8 = 4;
/// See [`Q8_0`].
#[allow(non_upper_case_globals)]
pub(super) const Q4K: u8 = 5;
/// See [`Q8_0`].
#[allow(non_upper_case_globals)]
pub(super) const Q6K: u8 = 6;

/// Bytes per block of the format `code`.
pub(super) const fn code_block_bytes(code: u8) -> usize {
    match code {
        Q8_0 => 34,
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        Q4K => 144,
        _ => 210,
    }
}

/// Units of 32 weights per block of the format `code`.
pub(super) const fn code_units(code: u8) -> usize {
    if matches!(code, Q4K | Q6K) { 8 } else { 1 }
}

/// Whether the format `code` stores signed values (the others add a minimum: `w = d·q + m`).
pub(super) const fn code_signed(code: u8) -> bool {
    matches!(code, Q8_0 | Q4_0 | Q5_0 | Q6K)
}

/// `$tile::<K, R, C>(ws, xs)` for the format of `$kind` (one of `$f…`, named as the `QuantKind`
/// variant and its format code; any other panics), `R = $xs.len()` (1–4) and `C = $ws.len()` (one of
/// `$c…`, else `$last`), its `R × C` results copied into `$out`: the dispatch both integer tile
/// families share (`$tile` must be in scope at the call, with the format codes).
macro_rules! tile_dispatch {
    ($tile:ident, $kind:expr, [$($f:ident),*], $ws:ident, $xs:ident, $out:ident, $cols:tt, $last:literal) => {
        match $kind {
            $(QuantKind::$f => tile_dispatch!(@cols $tile, $f, $ws, $xs, $out, $cols, $last),)*
            #[allow(unreachable_patterns)]
            other => unreachable!("no integer tile for {other:?}"),
        }
    };
    (@cols $tile:ident, $k:ident, $ws:ident, $xs:ident, $out:ident, [$($c:literal),*], $last:literal) => {
        match $ws.len() {
            $($c => tile_dispatch!(@rows $tile, $k, $c, $ws, $xs, $out),)*
            _ => tile_dispatch!(@rows $tile, $k, $last, $ws, $xs, $out),
        }
    };
    (@rows $tile:ident, $k:ident, $c:literal, $ws:ident, $xs:ident, $out:ident) => {
        match $xs.len() {
            1 => tile_dispatch!(@go $tile, $k, 1, $c, $ws, $xs, $out),
            2 => tile_dispatch!(@go $tile, $k, 2, $c, $ws, $xs, $out),
            3 => tile_dispatch!(@go $tile, $k, 3, $c, $ws, $xs, $out),
            _ => tile_dispatch!(@go $tile, $k, 4, $c, $ws, $xs, $out),
        }
    };
    (@go $tile:ident, $k:ident, $r:literal, $c:literal, $ws:ident, $xs:ident, $out:ident) => {{
        // SAFETY: expanded only in `qdot::avx2::dot_tile` and `qdot_avx512::dot_tile`, whose
        // `# Safety` (upheld by their callers) gives the CPU extensions `$tile` needs and a supported
        // format whose code `$k` has the same block size, with every `$ws[c]` holding `nb` whole blocks
        // and every `$xs[r]` at least `nb`; `$tile` indexes `$ws`/`$xs` with bounds checks for its
        // `$c`/`$r` rows (equal to their lengths here, within 1..=4).
        let t = unsafe { $tile::<$k, $r, $c>($ws, $xs) };
        for r in 0..$r {
            $out[r][..$c].copy_from_slice(&t[r]);
        }
    }};
}
pub(super) use tile_dispatch;

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::{Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q6K, Q8_0, Q8Block, code_block_bytes, code_signed, code_units};
    use crate::quant::QuantKind;
    use std::arch::x86_64::*;

    /// The little-endian f16 at `p`, widened.
    ///
    /// # Safety
    /// `p..p + 2` must be readable and F16C available.
    #[inline(always)]
    pub(in crate::cpu) unsafe fn f16_at(p: *const u8) -> f32 {
        // SAFETY: only the two bytes at `p` and `p + 1` are read (readable by our contract, and `u8`
        // needs no alignment); `_mm_cvtph_ps` needs F16C, which our contract gives.
        unsafe {
            let bits = (p.read() as i32) | ((p.add(1).read() as i32) << 8);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
        }
    }

    /// The 32 4-bit values of a Q4 block as unsigned bytes in element order (low nibbles are elements
    /// 0–15, high nibbles 16–31, as in ggml).
    ///
    /// # Safety
    /// `p..p + 16` must be readable (any alignment) and AVX available.
    #[inline(always)]
    pub(in crate::cpu) unsafe fn nibbles(p: *const u8) -> __m256i {
        // SAFETY: the unaligned `_mm_loadu_si128` reads the 16 readable bytes at `p` (our contract);
        // the rest is register-only SSE2 and AVX (`_mm256_set_m128i`), which our contract gives.
        unsafe {
            let qs = _mm_loadu_si128(p.cast());
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(qs, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
            _mm256_set_m128i(hi, lo)
        }
    }

    /// Each block of 32: `d = max|x| / 127`, `q = round_even(x · 127 / max|x|)`, `s = d · Σq`, with `d`
    /// and `s` rounded to f16 (ggml's `quantize_row_q8_1` for AVX2).
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available (any lengths: whole blocks of `x` pair with `out`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize(x: &[f32], out: &mut [Q8Block]) {
        for (blk, o) in x.chunks_exact(32).zip(out.iter_mut()) {
            // SAFETY: `blk` is a `chunks_exact(32)` chunk, so the four unaligned 8-lane loads at 0, 8,
            // 16 and 24 stay inside it, and the unaligned 32-byte store fills exactly `o.qs`; the
            // intrinsics need AVX2/FMA/F16C, enabled here and guaranteed by our caller (`# Safety`).
            unsafe {
                let p = blk.as_ptr();
                let v = [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ];
                let sign = _mm256_set1_ps(-0.0);
                let mut m = _mm256_andnot_ps(sign, v[0]);
                for vi in &v[1..] {
                    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
                }
                let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
                let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                let m1 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
                let amax = _mm_cvtss_f32(m1);
                let d = amax / 127.0;
                let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                let mul = _mm256_set1_ps(id);
                let mut r = [_mm256_setzero_si256(); 4];
                for i in 0..4 {
                    r[i] = _mm256_cvtps_epi32(_mm256_round_ps(
                        _mm256_mul_ps(v[i], mul),
                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
                    ));
                }
                let sum = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
                let s4 = _mm_add_epi32(_mm256_extracti128_si256(sum, 1), _mm256_castsi256_si128(sum));
                let s4 = _mm_hadd_epi32(s4, s4);
                let s4 = _mm_hadd_epi32(s4, s4);
                let total = _mm_cvtsi128_si32(s4);
                // i32 → i16 → i8 with saturation (values are within ±127), then undo the lane
                // interleaving of the two packs.
                let a = _mm256_packs_epi32(r[0], r[1]);
                let b = _mm256_packs_epi32(r[2], r[3]);
                let q = _mm256_packs_epi16(a, b);
                let q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256(o.qs.as_mut_ptr().cast(), q);
                let ds = _mm_setr_ps(d, d * total as f32, 0.0, 0.0);
                let back = _mm_cvtph_ps(_mm_cvtps_ph(ds, _MM_FROUND_TO_NEAREST_INT));
                o.d = _mm_cvtss_f32(back);
                o.s = _mm_cvtss_f32(_mm_movehdup_ps(back));
            }
        }
    }

    /// The fifth bits of a Q5 block's 32 values (bit j of the little-endian `u32` at `p` is value j's)
    /// as `0x10` or 0 per byte, in element order.
    ///
    /// # Safety
    /// `p..p + 4` must be readable (any alignment) and AVX2 available.
    #[inline(always)]
    pub(in crate::cpu) unsafe fn fifth_bits(p: *const u8) -> __m256i {
        // SAFETY: an unaligned read of the 4 readable bytes at `p` (our contract); the rest is
        // register-only AVX2, which our contract gives.
        unsafe {
            let qh = _mm256_set1_epi32(p.cast::<i32>().read_unaligned());
            // Byte j takes byte j / 8 of `qh` (each 128-bit lane holds all four), then its bit j % 8.
            let spread = _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3,
                3,
            );
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, spread), bit), bit);
            _mm256_and_si256(set, _mm256_set1_epi8(0x10))
        }
    }

    /// Unit `sub` (of [`code_units`]`(K)`) of the block of format `K` at `p`: its 32 values as bytes in
    /// element order (signed for [`code_signed`] formats, else unsigned), the scale of its integer sum,
    /// the factor of the activations' sum it adds (`w = d·q + m`; 0 for the signed formats), and the i16
    /// multipliers of its 16 pair sums (ones, but for Q6_K the scales of its two 16-value sub-blocks).
    ///
    /// # Safety
    /// `p` points to a whole readable block of format `K` (`code_block_bytes(K)` bytes), `sub <
    /// code_units(K)`; AVX2 and F16C available.
    #[inline(always)]
    pub(in crate::cpu) unsafe fn unit<const K: u8>(p: *const u8, sub: usize) -> (__m256i, f32, f32, __m256i) {
        // SAFETY: every read stays in the block (our contract): Q8_0 bytes 2..34 of 34; Q4_0 2..18 of
        // 18; Q4_1 2..20 of 20; Q5_0 2..22 of 22; Q5_1 2..24 of 24; Q4_K 0..16 and, for `sub < 8`,
        // 16 + 32·(sub/2) + 32 ≤ 144; Q6_K, for `sub < 8`, 64·(sub/4) + 32·(sub%2) + 32 ≤ 128, 128 +
        // 32·(sub/4) + 32 ≤ 192, 192 + 8·(sub/4) + 2·(sub%4) + 2 ≤ 208 and 208..210. Loads are
        // unaligned; the intrinsics need AVX2/F16C (our contract).
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let low4 = _mm256_set1_epi8(0x0F);
            match K {
                Q8_0 => (_mm256_loadu_si256(p.add(2).cast()), f16_at(p), 0.0, ones),
                Q4_0 => (
                    _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8)),
                    f16_at(p),
                    0.0,
                    ones,
                ),
                Q4_1 => (nibbles(p.add(4)), f16_at(p), f16_at(p.add(2)), ones),
                Q5_0 => {
                    let q = _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2)));
                    (_mm256_sub_epi8(q, _mm256_set1_epi8(16)), f16_at(p), 0.0, ones)
                }
                Q5_1 => {
                    let q = _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4)));
                    (q, f16_at(p), f16_at(p.add(2)), ones)
                }
                Q4K => {
                    // Sub-blocks 2n and 2n + 1 are the low and high nibbles of bytes 32n..32n + 32.
                    let qs = _mm256_loadu_si256(p.add(16 + 32 * (sub / 2)).cast());
                    let q = _mm256_and_si256(
                        _mm256_srl_epi16(qs, _mm_cvtsi32_si128(4 * (sub as i32 & 1))),
                        low4,
                    );
                    let scales = std::slice::from_raw_parts(p.add(4), 12);
                    let (sc, mn) = crate::quant::scale_min_k4(sub, scales);
                    (q, f16_at(p) * sc as f32, -(f16_at(p.add(2)) * mn as f32), ones)
                }
                _ => {
                    // Q6_K: half h = sub / 4 holds values 128h..128h + 128; its i-th 32 (i = sub % 4)
                    // are the low (i < 2) or high nibbles of `ql[64h + 32(i % 2)..]` with bits 2i, 2i + 1
                    // of `qh[128 + 32h..]` above them, minus 32; scales `sc[8h + 2i]`, `sc[8h + 2i + 1]`.
                    let (h, i) = (sub / 4, sub % 4);
                    let ql = _mm256_loadu_si256(p.add(64 * h + 32 * (i & 1)).cast());
                    let lo =
                        _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (i as i32 >> 1))), low4);
                    let qh = _mm256_loadu_si256(p.add(128 + 32 * h).cast());
                    let hi = _mm256_and_si256(
                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * i as i32)),
                        _mm256_set1_epi8(3),
                    );
                    let q = _mm256_sub_epi8(
                        _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)),
                        _mm256_set1_epi8(32),
                    );
                    let sc = p.add(192 + 8 * h + 2 * i);
                    let (a, b) = (sc.read() as i8 as i16, sc.add(1).read() as i8 as i16);
                    (
                        q,
                        f16_at(p.add(208)),
                        0.0,
                        _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a)),
                    )
                }
            }
        }
    }

    /// [`super::dot_tile`] once its shapes are checked.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; `ws` holds 1–2 rows and `xs` 1–4, every `ws[c]` exactly
    /// `nb` whole blocks of `kind` and every `xs[r]` at least `nb · kind.block_elems() / 32` blocks
    /// (what [`super::dot_tile`] asserts).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_tile(kind: QuantKind, ws: &[&[u8]], xs: &[&[Q8Block]], out: &mut [[f32; 2]; 4]) {
        let plain = matches!(kind, QuantKind::Q8_0 | QuantKind::Q4_0 | QuantKind::Q4_1);
        if plain && ws.len() == 1 && xs.len() == 1 {
            // Decode: the plain loop (the generic tile is slower here); the same operations.
            // SAFETY: `dot1` needs only the extensions enabled here, which our caller guarantees
            // (`# Safety`); it reads `ws[0]` block by block with `chunks_exact` and indexes `xs[0]`
            // with bounds checks.
            out[0][0] = unsafe { dot1(kind, ws[0], xs[0]) };
            return;
        }
        tile_dispatch!(
            tile,
            kind,
            [Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q6K],
            ws,
            xs,
            out,
            [1],
            2
        )
    }

    /// One activation row against one weight row, with exactly [`tile`]'s operations per block.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available (any lengths: blocks are read with `chunks_exact`, `x` with
    /// bounds checks).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot1(kind: QuantKind, w: &[u8], x: &[Q8Block]) -> f32 {
        use crate::cpu::simd::{Avx2, Simd};
        let bb = kind.block_bytes();
        let ones = _mm256_set1_epi16(1);
        let eight = _mm256_set1_epi8(8);
        let mut acc = _mm256_setzero_ps();
        let mut extra = 0.0f32;
        for (b, blk) in w.chunks_exact(bb).enumerate() {
            let p = blk.as_ptr();
            // SAFETY: `blk` is exactly `bb = kind.block_bytes()` bytes (`chunks_exact`) and every read
            // stays inside it: the scale at 0..2, then Q8_0 (34 bytes) 32 values at 2..34, Q4_0 (18) 16
            // bytes at 2..18, Q4_1 (20) its minimum at 2..4 and 16 bytes at 4..20 (the `_` arm, whose
            // 20 bytes also fit any larger block); loads are unaligned; `xb` is a checked index; the
            // extensions are enabled here and guaranteed by our caller (`# Safety`).
            unsafe {
                let dw = f16_at(p);
                let (wv, signed) = match kind {
                    QuantKind::Q8_0 => (_mm256_loadu_si256(p.add(2).cast()), true),
                    QuantKind::Q4_0 => (_mm256_sub_epi8(nibbles(p.add(2)), eight), true),
                    _ => (nibbles(p.add(4)), false),
                };
                let wu = if signed { _mm256_sign_epi8(wv, wv) } else { wv };
                let m = if kind == QuantKind::Q4_1 {
                    f16_at(p.add(2))
                } else {
                    0.0
                };
                let xb = &x[b];
                let xv = _mm256_loadu_si256(xb.qs.as_ptr().cast());
                let x8 = if signed { _mm256_sign_epi8(xv, wv) } else { xv };
                let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, x8), ones);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * xb.d), _mm256_cvtepi32_ps(p32), acc);
                if kind == QuantKind::Q4_1 {
                    extra += m * xb.s;
                }
            }
        }
        // SAFETY: `Avx2::hsum` needs AVX, enabled here and guaranteed by our caller (`# Safety`).
        unsafe { Avx2::hsum(acc) + extra }
    }

    /// `R` activation rows against `C` weight rows. Every (row, column) output is the same operation
    /// sequence whatever `R` and `C` are (the tile only shares loads).
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; with `nb = ws[0].len() / code_block_bytes(K)`, every
    /// `ws[c]` (`c < C`) holds at least `nb` blocks of format `K` and every `xs[r]` (`r < R`) at least
    /// `nb · code_units(K)` blocks (`ws` and `xs` themselves are indexed with bounds checks).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const K: u8, const R: usize, const C: usize>(
        ws: &[&[u8]],
        xs: &[&[Q8Block]],
    ) -> [[f32; C]; R] {
        use crate::cpu::simd::{Avx2, Simd};
        let bb = code_block_bytes(K);
        let per = code_units(K);
        let units = ws[0].len() / bb * per;
        // SAFETY: for `u < units`, block `u / per` of `ws[c]` starts at `(u / per) · bb` and lies inside
        // it (our contract), and `unit` reads only that block (its `# Safety`, with `u % per <
        // code_units(K)`); `xs[r].as_ptr().add(u)` is one of its at least `units` blocks, aligned as
        // an element of a `&[Q8Block]`, and `qs` is read unaligned; the extensions are enabled here
        // and guaranteed by our caller (`# Safety`).
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            let mut extra = [[0.0f32; C]; R];
            for u in 0..units {
                let mut wv = [_mm256_setzero_si256(); C];
                let mut wu = [_mm256_setzero_si256(); C];
                let mut mul = [_mm256_setzero_si256(); C];
                let mut dw = [0.0f32; C];
                let mut m = [0.0f32; C];
                for c in 0..C {
                    let p = ws[c].as_ptr().add(u / per * bb);
                    (wv[c], dw[c], m[c], mul[c]) = unit::<K>(p, u % per);
                    // For the signed formats also the weights' absolute values (maddubs wants one
                    // unsigned operand, so the sign moves to the activations).
                    wu[c] = if code_signed(K) {
                        _mm256_sign_epi8(wv[c], wv[c])
                    } else {
                        wv[c]
                    };
                }
                for r in 0..R {
                    let xb = xs[r].as_ptr().add(u);
                    let xv = _mm256_loadu_si256((*xb).qs.as_ptr().cast());
                    let dx = _mm256_set1_ps((*xb).d);
                    for c in 0..C {
                        let x8 = if code_signed(K) {
                            _mm256_sign_epi8(xv, wv[c])
                        } else {
                            xv
                        };
                        let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(wu[c], x8), mul[c]);
                        let dd = _mm256_mul_ps(_mm256_set1_ps(dw[c]), dx);
                        acc[r][c] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(p32), acc[r][c]);
                        if !code_signed(K) {
                            // w = d·q + m: the m·Σx part.
                            extra[r][c] += m[c] * (*xb).s;
                        }
                    }
                }
            }
            let mut out = [[0.0f32; C]; R];
            for r in 0..R {
                for c in 0..C {
                    out[r][c] = Avx2::hsum(acc[r][c]) + extra[r][c];
                }
            }
            out
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::cpu::simd::Isa;
    use crate::cpu::test_data::lcg;
    use crate::quant::{dequantize_row, quantize_q4_0, quantize_q8_0};

    /// A Q4_1 row built by hand (no quantizer here): random nibbles, scales and minimums.
    pub(in crate::cpu) fn q4_1_row(seed: u64, k: usize) -> Vec<u8> {
        let r = lcg(seed, k / 32 * 20);
        let mut out = Vec::new();
        for (b, chunk) in r.chunks(20).enumerate() {
            out.extend_from_slice(&half::f16::from_f32(0.01 + 0.001 * b as f32).to_le_bytes());
            out.extend_from_slice(&half::f16::from_f32(chunk[0] * 0.1).to_le_bytes());
            out.extend((0..16).map(|j| ((chunk[1 + j % 19].to_bits() >> 7) & 0xFF) as u8));
        }
        out
    }

    #[test]
    fn integer_dots_match_the_dequantized_dot_within_activation_rounding() {
        if !supported(Isa::detect()) {
            return;
        }
        let k = 512;
        let w = lcg(1, k);
        let random = |kind: QuantKind| crate::quant::test_blocks::blocks(kind, k / kind.block_elems());
        for (kind, bytes) in [
            (QuantKind::Q8_0, quantize_q8_0(&w)),
            (QuantKind::Q4_0, quantize_q4_0(&w)),
            (QuantKind::Q4_1, q4_1_row(3, k)),
            (QuantKind::Q5_0, random(QuantKind::Q5_0)),
            (QuantKind::Q5_1, random(QuantKind::Q5_1)),
            (QuantKind::Q4K, random(QuantKind::Q4K)),
            (QuantKind::Q6K, random(QuantKind::Q6K)),
        ] {
            let mut wf = vec![0.0; k];
            dequantize_row(kind, &bytes, &mut wf);
            let rows: Vec<Vec<f32>> = (0..4).map(|i| lcg(10 + i, k)).collect();
            let flat: Vec<f32> = rows.concat();
            let q = quantize_rows(&flat, 4, k);
            // The vectorised quantizer agrees with the scalar one (ties aside, which random data lacks).
            let scalar = quantize_rows_scalar(&flat, 4, k);
            for (a, b) in q.iter().zip(&scalar) {
                assert_eq!((a.d, a.s, a.qs), (b.d, b.s, b.qs), "{kind:?}");
            }
            let xs: Vec<&[Q8Block]> = q.chunks(k / 32).collect();
            let mut tile = [[0.0f32; 2]; 4];
            dot_tile(kind, &[&bytes, &bytes], &xs, &mut tile);
            let got: Vec<f32> = tile.iter().map(|t| t[0]).collect();
            for (r, x) in rows.iter().enumerate() {
                assert_eq!(
                    tile[r][0].to_bits(),
                    tile[r][1].to_bits(),
                    "{kind:?}: columns agree"
                );
                let want: f64 = x.iter().zip(&wf).map(|(a, b)| *a as f64 * *b as f64).sum();
                let scale: f64 = x
                    .iter()
                    .zip(&wf)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                assert!(
                    (got[r] as f64 - want).abs() <= 0.01 * scale,
                    "{kind:?} row {r}: {} vs {want} (scale {scale})",
                    got[r]
                );
                // Against the 8-bit activations themselves the only differences are float rounding
                // and the f16 rounding of the blocks' sums (`s`): a misplaced scale or value is not.
                let xq: Vec<f64> = xs[r][..k / 32]
                    .iter()
                    .flat_map(|b| b.qs.iter().map(move |&q| b.d as f64 * q as f64))
                    .collect();
                let exact: f64 = xq.iter().zip(&wf).map(|(a, b)| a * *b as f64).sum();
                assert!(
                    (got[r] as f64 - exact).abs() <= 1e-4 * scale,
                    "{kind:?} row {r}: {} vs {exact} with the 8-bit activations (scale {scale})",
                    got[r]
                );
                // The same row alone gives the same bits (no dependence on the tile).
                let mut alone = [[0.0f32; 2]; 4];
                dot_tile(kind, &[&bytes], &xs[r..r + 1], &mut alone);
                assert_eq!(alone[0][0].to_bits(), got[r].to_bits(), "{kind:?} row {r}");
            }
        }
    }
}
