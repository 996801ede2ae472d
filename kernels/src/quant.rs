//! GGML block-quantized weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K): block geometry, dequantization
//! to f32, and the simple quantizers (`Q8_0`, `Q4_0`) `gen-model` and tests use.
//!
//! Invariants: layouts are exactly ggml's (`ggml-common.h`: `block_q4_0` … `block_q6_K`), little-endian,
//! read byte-wise so blocks need no alignment; dequantization performs the same f32 operations, in the
//! same order, as ggml's reference `dequantize_row_*` (checked against candle's independent port in the
//! tests), so a weight means the same number here as in llama.cpp. The portable kernels multiply these
//! f32 values; with AVX2 every format takes integer products instead (`cpu::qdot`).

use half::f16;

/// A block-quantized format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantKind {
    /// 32 weights: f16 scale, 4-bit values offset by 8.
    Q4_0,
    /// 32 weights: f16 scale and minimum, 4-bit values.
    Q4_1,
    /// 32 weights: f16 scale, 5-bit values offset by 16 (the fifth bits packed in a `u32`).
    Q5_0,
    /// 32 weights: f16 scale and minimum, 5-bit values (the fifth bits packed in a `u32`).
    Q5_1,
    /// 32 weights: f16 scale, 8-bit values.
    Q8_0,
    /// 256 weights: super-block scale/min, 8 sub-blocks with 6-bit scales and mins, 4-bit values.
    Q4K,
    /// 256 weights: 16 sub-blocks with 8-bit scales, 6-bit values.
    Q6K,
}

impl QuantKind {
    /// Every format.
    pub const ALL: [QuantKind; 7] = [
        QuantKind::Q8_0,
        QuantKind::Q4_0,
        QuantKind::Q4_1,
        QuantKind::Q5_0,
        QuantKind::Q5_1,
        QuantKind::Q4K,
        QuantKind::Q6K,
    ];

    /// Weights per block.
    pub const fn block_elems(self) -> usize {
        match self {
            QuantKind::Q4_0 | QuantKind::Q4_1 | QuantKind::Q5_0 | QuantKind::Q5_1 | QuantKind::Q8_0 => 32,
            QuantKind::Q4K | QuantKind::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantKind::Q4_0 => 18,
            QuantKind::Q4_1 => 20,
            QuantKind::Q5_0 => 22,
            QuantKind::Q5_1 => 24,
            QuantKind::Q8_0 => 34,
            QuantKind::Q4K => 144,
            QuantKind::Q6K => 210,
        }
    }

    /// The GGML type name.
    pub const fn name(self) -> &'static str {
        match self {
            QuantKind::Q4_0 => "q4_0",
            QuantKind::Q4_1 => "q4_1",
            QuantKind::Q5_0 => "q5_0",
            QuantKind::Q5_1 => "q5_1",
            QuantKind::Q8_0 => "q8_0",
            QuantKind::Q4K => "q4_K",
            QuantKind::Q6K => "q6_K",
        }
    }
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes one block (`kind.block_bytes()` bytes) into `out` (`kind.block_elems()` values).
#[inline]
pub fn dequantize_block(kind: QuantKind, b: &[u8], out: &mut [f32]) {
    match kind {
        QuantKind::Q4_0 => {
            let d = f16_at(b, 0);
            for j in 0..16 {
                out[j] = ((b[2 + j] & 0x0F) as i32 - 8) as f32 * d;
                out[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
            }
        }
        QuantKind::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for j in 0..16 {
                out[j] = (b[4 + j] & 0x0F) as f32 * d + m;
                out[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
            }
        }
        QuantKind::Q5_0 | QuantKind::Q5_1 => dequantize_q5(kind == QuantKind::Q5_0, b, out),
        QuantKind::Q8_0 => {
            let d = f16_at(b, 0);
            for j in 0..32 {
                out[j] = (b[2 + j] as i8) as f32 * d;
            }
        }
        QuantKind::Q4K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let q = &b[16..144];
            for (n, j) in (0..256).step_by(64).enumerate() {
                let (sc1, m1) = scale_min_k4(2 * n, scales);
                let (sc2, m2) = scale_min_k4(2 * n + 1, scales);
                let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
                let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
                let qs = &q[32 * n..32 * n + 32];
                for l in 0..32 {
                    out[j + l] = d1 * (qs[l] & 0x0F) as f32 - min1;
                    out[j + 32 + l] = d2 * (qs[l] >> 4) as f32 - min2;
                }
            }
        }
        QuantKind::Q6K => {
            let d = f16_at(b, 208);
            for half in 0..2 {
                let ql = &b[64 * half..64 * half + 64];
                let qh = &b[128 + 32 * half..128 + 32 * half + 32];
                let sc = &b[192 + 8 * half..192 + 8 * half + 8];
                let y = &mut out[128 * half..128 * half + 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                    y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                    y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                    y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                }
            }
        }
    }
}

/// ggml's `dequantize_row_q5_0` (`signed`) or `dequantize_row_q5_1` for one block: bit j of `qh` is
/// element j's fifth bit.
fn dequantize_q5(signed: bool, b: &[u8], out: &mut [f32]) {
    let (d, m, at) = if signed {
        (f16_at(b, 0), 0.0, 2)
    } else {
        (f16_at(b, 0), f16_at(b, 2), 4)
    };
    let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let qs = &b[at + 4..at + 20];
    let off = if signed { 16 } else { 0 };
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        let x0 = ((qs[j] & 0x0F) as u32 | h0) as i32 - off;
        let x1 = ((qs[j] >> 4) as u32 | h1) as i32 - off;
        if signed {
            out[j] = x0 as f32 * d;
            out[j + 16] = x1 as f32 * d;
        } else {
            out[j] = x0 as f32 * d + m;
            out[j + 16] = x1 as f32 * d + m;
        }
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of a Q4_K block.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes a whole row of blocks into `out`.
pub fn dequantize_row(kind: QuantKind, bytes: &[u8], out: &mut [f32]) {
    let (be, bb) = (kind.block_elems(), kind.block_bytes());
    for (blk, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        dequantize_block(kind, blk, o);
    }
}

/// Quantizes `values` (a multiple of 32) to Q8_0 the way ggml's `quantize_row_q8_0_ref` does.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 34);
    for blk in values.chunks(32) {
        let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(blk.iter().map(|v| ((v * id).round() as i8) as u8));
    }
    out
}

/// Quantizes `values` (a multiple of 32) to Q4_0 the way ggml's `quantize_row_q4_0_ref` does.
pub fn quantize_q4_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 18);
    for blk in values.chunks(32) {
        // The value of largest magnitude, keeping its sign, maps to -8.
        let max = blk
            .iter()
            .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        let q = |v: f32| ((v * id + 8.5) as i32).min(15) as u8;
        out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::k_quants::{
        BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, GgmlType,
    };

    use super::test_blocks::{blocks, bytes};

    fn candle_dequant<T: GgmlType>(b: &[u8], n: usize) -> Vec<f32> {
        assert_eq!(std::mem::size_of::<T>() * n, b.len());
        let mut blocks: Vec<T> = (0..n).map(|_| T::zeros()).collect();
        // SAFETY: ggml block structs are `repr(C)` byte layouts without padding (size checked above).
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), blocks.as_mut_ptr().cast::<u8>(), b.len()) };
        let mut out = vec![0.0; n * T::BLCK_SIZE];
        T::to_float(&blocks, &mut out);
        out
    }

    #[test]
    fn dequantization_matches_candle_bit_for_bit() {
        for kind in QuantKind::ALL {
            let n = 5;
            let b = blocks(kind, n);
            let mut ours = vec![0.0; n * kind.block_elems()];
            dequantize_row(kind, &b, &mut ours);
            let theirs = match kind {
                QuantKind::Q4_0 => candle_dequant::<BlockQ4_0>(&b, n),
                QuantKind::Q4_1 => candle_dequant::<BlockQ4_1>(&b, n),
                QuantKind::Q5_0 => candle_dequant::<BlockQ5_0>(&b, n),
                QuantKind::Q5_1 => candle_dequant::<BlockQ5_1>(&b, n),
                QuantKind::Q8_0 => candle_dequant::<BlockQ8_0>(&b, n),
                QuantKind::Q4K => candle_dequant::<BlockQ4K>(&b, n),
                QuantKind::Q6K => candle_dequant::<BlockQ6K>(&b, n),
            };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ours), bits(&theirs), "{kind:?}");
        }
    }

    #[test]
    fn quantizers_round_trip_within_a_step() {
        let v: Vec<f32> = bytes(9, 96).iter().map(|&b| (b as f32 - 128.0) / 50.0).collect();
        for (kind, q) in [
            (QuantKind::Q8_0, quantize_q8_0(&v)),
            (QuantKind::Q4_0, quantize_q4_0(&v)),
        ] {
            assert_eq!(q.len(), 3 * kind.block_bytes());
            let mut back = vec![0.0; 96];
            dequantize_row(kind, &q, &mut back);
            // Q8_0 rounds to the nearest of 255 steps; Q4_0's range is asymmetric (the largest
            // magnitude maps to -8), so the opposite extreme may clamp by up to one step.
            let (step, tol) = if kind == QuantKind::Q8_0 {
                (2.56 / 127.0, 0.51)
            } else {
                (2.56 / 8.0, 1.0)
            };
            for (a, b) in v.iter().zip(&back) {
                assert!((a - b).abs() <= step * tol + 1e-3, "{kind:?}: {a} vs {b}");
            }
        }
        assert_eq!(quantize_q8_0(&v), candle_quant::<BlockQ8_0>(&v));
        assert_eq!(quantize_q4_0(&v), candle_quant::<BlockQ4_0>(&v));
    }

    /// Candle's port of ggml's reference quantizer, as bytes.
    fn candle_quant<T: GgmlType>(v: &[f32]) -> Vec<u8> {
        let n = v.len() / T::BLCK_SIZE;
        let mut blocks: Vec<T> = (0..n).map(|_| T::zeros()).collect();
        T::from_float(v, &mut blocks);
        // SAFETY: as in `candle_dequant`.
        unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), n * std::mem::size_of::<T>()) }
            .to_vec()
    }
}

/// Seeded random blocks of every format, for the tests here and the kernels'.
#[cfg(test)]
pub(crate) mod test_blocks {
    use super::QuantKind;
    use half::f16;

    /// `n` pseudo-random bytes from `seed`.
    pub(crate) fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect()
    }

    /// `n` random blocks of `kind` with sane f16 scales (random bits could be NaN).
    pub(crate) fn blocks(kind: QuantKind, n: usize) -> Vec<u8> {
        let mut b = bytes(kind.block_bytes() as u64, n * kind.block_bytes());
        for (i, blk) in b.chunks_exact_mut(kind.block_bytes()).enumerate() {
            let d = f16::from_f32(0.01 + i as f32 * 0.003).to_le_bytes();
            let m = f16::from_f32(-0.05 + i as f32 * 0.01).to_le_bytes();
            let at = |blk: &mut [u8], o: usize, v: [u8; 2]| blk[o..o + 2].copy_from_slice(&v);
            match kind {
                QuantKind::Q4_0 | QuantKind::Q5_0 | QuantKind::Q8_0 => at(blk, 0, d),
                QuantKind::Q4_1 | QuantKind::Q5_1 | QuantKind::Q4K => {
                    at(blk, 0, d);
                    at(blk, 2, m);
                }
                QuantKind::Q6K => at(blk, 208, d),
            }
        }
        b
    }
}
