//! Row-wise and element-wise CPU kernels: embedding gather, RMSNorm, RoPE, SwiGLU, residual add,
//! KV-cache writes, row gathers and a numerically stable softmax.
//!
//! Invariants: every row is computed independently with a sequential, fixed-order reduction, so results
//! do not depend on the batch; rows are spread over the compute threads only when the work is large.
//! Formulas follow Hugging Face `transformers`' Llama: RMSNorm `x / sqrt(mean(x²) + eps) · w` in f32,
//! RoPE in the rotate-half layout (pairs `(i, i + r/2)` over the first `r` rotary elements of a head)
//! with angle `pos · inv_freq[i]` in f32.

use super::pool;
use super::simd::{self, Isa, Portable, Simd};
use crate::layout::{KvDType, KvLayout, Rope};
use crate::weight::WeightData;

/// Rows per task for row-wise kernels; below this a single thread is faster.
const MIN_ROWS_PER_TASK: usize = 8;

/// `out[r] = table[ids[r]]`.
pub(crate) fn embedding(table: WeightData<'_>, dim: usize, ids: &[u32], out: &mut [f32]) {
    for (r, &id) in ids.iter().enumerate() {
        table.copy_to_f32(id as usize * dim, &mut out[r * dim..(r + 1) * dim]);
    }
}

/// Row-wise RMSNorm.
pub(crate) fn rms_norm(x: &[f32], w: WeightData<'_>, eps: f32, out: &mut [f32], rows: usize) {
    let dim = w.len();
    let mut wf = vec![0.0f32; dim];
    w.copy_to_f32(0, &mut wf);
    pool::for_each_chunk(&mut out[..rows * dim], dim, MIN_ROWS_PER_TASK, |r, o| {
        let xr = &x[r * dim..(r + 1) * dim];
        let ss = xr.iter().fold(0.0f32, |a, v| a + v * v);
        let inv = 1.0 / (ss / dim as f32 + eps).sqrt();
        for ((o, v), g) in o.iter_mut().zip(xr).zip(&wf) {
            *o = g * (v * inv);
        }
    });
}

/// Rotary embedding in place, rotate-half or interleaved pairs, over the first `2 · inv_freq.len()`
/// elements of each head.
pub(crate) fn rope(x: &mut [f32], num_heads: usize, head_dim: usize, positions: &[u32], rope: Rope<'_>) {
    let Rope {
        inv_freq,
        interleaved,
        scale,
    } = rope;
    let half = inv_freq.len();
    // Element indices of pair `i`.
    let pair = |i: usize| {
        if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        }
    };
    assert!(
        2 * half <= head_dim,
        "{half} rotary pairs in a head of {head_dim}"
    );
    let width = num_heads * head_dim;
    pool::for_each_chunk(
        &mut x[..positions.len() * width],
        width,
        MIN_ROWS_PER_TASK,
        |r, row| {
            let pos = positions[r] as f32;
            let (cos, sin): (Vec<f32>, Vec<f32>) = inv_freq
                .iter()
                .map(|f| {
                    let a = pos * f;
                    (a.cos() * scale, a.sin() * scale)
                })
                .unzip();
            for h in row.chunks_mut(head_dim) {
                for i in 0..half {
                    let (a, b) = pair(i);
                    let (x0, x1) = (h[a], h[b]);
                    h[a] = x0 * cos[i] - x1 * sin[i];
                    h[b] = x1 * cos[i] + x0 * sin[i];
                }
            }
        },
    );
}

/// `out = silu(gate) · up` (SwiGLU).
pub(crate) fn silu_mul(isa: Isa, gate: &[f32], up: &[f32], out: &mut [f32]) {
    gated::<false>(isa, gate, up, out);
}

/// `out = gelu_tanh(gate) · up` (GeGLU).
pub(crate) fn gelu_mul(isa: Isa, gate: &[f32], up: &[f32], out: &mut [f32]) {
    gated::<true>(isa, gate, up, out);
}

/// `out = act(gate) · up`, `act` being tanh GELU when `GELU`, SiLU otherwise.
fn gated<const GELU: bool>(isa: Isa, gate: &[f32], up: &[f32], out: &mut [f32]) {
    pool::for_each_chunk(out, 4096, 1, |c, o| {
        let base = c * 4096;
        let (g, u) = (&gate[base..base + o.len()], &up[base..base + o.len()]);
        // SAFETY: the ISA was detected on this CPU; the slices have equal lengths.
        unsafe {
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 | Isa::Avx512 => gated_avx2::<GELU>(g, u, o),
                _ => gated_lanes::<Portable, GELU>(g, u, o),
            }
        }
    });
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gated_avx2<const GELU: bool>(g: &[f32], u: &[f32], o: &mut [f32]) {
    // SAFETY: `Avx2` needs AVX2/FMA/F16C, enabled here and guaranteed by our caller (`# Safety`);
    // `gated_lanes` asks nothing else.
    unsafe { gated_lanes::<super::simd::Avx2, GELU>(g, u, o) }
}

/// `o = act(g) · u`, 8 lanes at a time (the activation first, then the product with `u`).
///
/// # Safety
/// `S`'s instruction set must be available.
#[inline(always)]
unsafe fn gated_lanes<S: Simd, const GELU: bool>(g: &[f32], u: &[f32], o: &mut [f32]) {
    // SAFETY: `S` is available (our contract); `simd::silu` and `simd::gelu_tanh` keep their loads and
    // stores within `g` and `o` (they run to the shorter one's length, padding the tail).
    unsafe {
        if GELU {
            simd::gelu_tanh::<S>(g, o)
        } else {
            simd::silu::<S>(g, o)
        }
    };
    for (o, u) in o.iter_mut().zip(u) {
        *o *= u;
    }
}

/// Stores new keys and values at their slots, in the cache's element type.
pub(crate) fn write_kv(
    k: &[f32],
    v: &[f32],
    slots: &[u32],
    layout: &KvLayout,
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) {
    match layout.dtype {
        KvDType::F32 => write_kv_as(k, v, slots, layout, k_cache, v_cache, |x| x),
        KvDType::F16 => write_kv_as(
            k,
            v,
            slots,
            layout,
            bytemuck::cast_slice_mut::<f32, u16>(k_cache),
            bytemuck::cast_slice_mut::<f32, u16>(v_cache),
            |x| half::f16::from_f32(x).to_bits(),
        ),
        KvDType::Q8_0 => {
            write_kv_q8(k, slots, layout, k_cache, true);
            write_kv_q8(v, slots, layout, v_cache, false);
        }
    }
}

/// [`write_kv`] into an 8-bit cache: each head vector quantized with its own scale
/// ([`super::kv_q8`]); keys transposed within the block, values as rows.
fn write_kv_q8(x: &[f32], slots: &[u32], layout: &KvLayout, cache: &mut [f32], keys: bool) {
    let (hd, bs) = (layout.head_dim, layout.block_size);
    let width = layout.num_kv_heads * hd;
    let (elems, scales) = super::kv_q8::parts_mut(layout, cache);
    for (r, &slot) in slots.iter().enumerate() {
        let (block, s) = (slot as usize / bs, slot as usize % bs);
        assert!(block < layout.num_blocks, "slot {slot} outside the KV cache");
        for h in 0..layout.num_kv_heads {
            let src = &x[r * width + h * hd..][..hd];
            let scale = if keys {
                let k0 = layout.key_offset(block, h, s);
                super::kv_q8::quantize(src, |d, q| elems[k0 + d * bs] = q)
            } else {
                let v0 = layout.offset(block, h, s);
                super::kv_q8::quantize(src, |d, q| elems[v0 + d] = q)
            };
            scales[layout.scale_offset(block, h, s)] = scale;
        }
    }
}

fn write_kv_as<E: Copy>(
    k: &[f32],
    v: &[f32],
    slots: &[u32],
    layout: &KvLayout,
    k_cache: &mut [E],
    v_cache: &mut [E],
    conv: impl Fn(f32) -> E,
) {
    let hd = layout.head_dim;
    let width = layout.num_kv_heads * hd;
    for (r, &slot) in slots.iter().enumerate() {
        let (block, s) = (
            slot as usize / layout.block_size,
            slot as usize % layout.block_size,
        );
        assert!(block < layout.num_blocks, "slot {slot} outside the KV cache");
        for h in 0..layout.num_kv_heads {
            let src = r * width + h * hd;
            // Keys transposed within the block (see `KvLayout::key_offset`), values as rows.
            let k0 = layout.key_offset(block, h, s);
            for (d, &x) in k[src..src + hd].iter().enumerate() {
                k_cache[k0 + d * layout.block_size] = conv(x);
            }
            let off = layout.offset(block, h, s);
            for (o, &x) in v_cache[off..off + hd].iter_mut().zip(&v[src..src + hd]) {
                *o = conv(x);
            }
        }
    }
}

/// Softmax of `x` in place (max-subtracted; `-inf` entries become 0). Returns the log of the
/// normaliser relative to the max, so `log p_i = x_i - max - returned`.
pub fn softmax_in_place(x: &mut [f32]) -> f32 {
    let mx = max_lanes(x);
    if mx == f32::NEG_INFINITY {
        return f32::NAN;
    }
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    // SAFETY: the ISA was detected on this CPU.
    unsafe {
        match *ISA.get_or_init(Isa::detect) {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 => exp_in_place_avx2(x, mx),
            _ => exp_in_place::<Portable>(x, mx),
        }
    }
    // Eight independent f64 sums (vectorised), added in a fixed order.
    let mut lanes = [0.0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += *v as f64;
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| v as f64).sum();
    let sum = lanes.iter().sum::<f64>() + tail;
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
    sum.ln() as f32
}

/// The largest element of `x`, NaN ignored (`-inf` when there is none), 16 lanes at a time.
pub fn max_lanes(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = if v > *l { v } else { *l };
        }
    }
    chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_in_place_avx2(x: &mut [f32], shift: f32) {
    // SAFETY: `Avx2` needs AVX2/FMA/F16C, enabled here and guaranteed by our caller (`# Safety`);
    // `exp_in_place` asks nothing else.
    unsafe { exp_in_place::<super::simd::Avx2>(x, shift) }
}

/// `x[i] = e^(x[i] - shift)` with the vector exp ([`simd::exp_shifted`]), through a stack buffer.
///
/// # Safety
/// `S`'s instruction set must be available.
#[inline(always)]
unsafe fn exp_in_place<S: Simd>(x: &mut [f32], shift: f32) {
    let mut tmp = [0.0f32; 256];
    for c in x.chunks_mut(256) {
        let t = &mut tmp[..c.len()];
        // SAFETY: `S` is available (our contract); `exp_shifted` stays within the slices `c` and `t`.
        unsafe { simd::exp_shifted::<S>(c, shift, t) };
        c.copy_from_slice(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weight::HostWeight;

    #[test]
    fn rms_norm_matches_formula() {
        let w = HostWeight::from_f32(&[1.0, 2.0], 1, 2).unwrap();
        let mut out = [0.0; 2];
        rms_norm(&[3.0, 4.0], w.data(), 0.0, &mut out, 1);
        let inv = 1.0 / (12.5f32).sqrt();
        assert_eq!(out, [3.0 * inv, 2.0 * (4.0 * inv)]);
    }

    #[test]
    fn gelu_mul_matches_the_tanh_formula_on_every_isa() {
        // Across the range, the saturated ends, and a length with a tail (37 = 4 · 8 + 5).
        let g: Vec<f32> = (0..37)
            .map(|i| (i as f32 - 18.0) * 0.7)
            .chain([-90.0, 90.0])
            .collect();
        let u: Vec<f32> = (0..g.len()).map(|i| 1.0 + i as f32 * 0.01).collect();
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&x, &u)| {
                let x = x as f64;
                let t = ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh();
                0.5 * x * (1.0 + t) * u as f64
            })
            .collect();
        let mut isas = vec![Isa::Portable];
        if Isa::detect().has_avx2() {
            isas.push(Isa::Avx2);
        }
        for isa in isas {
            let mut out = vec![f32::NAN; g.len()];
            gelu_mul(isa, &g, &u, &mut out);
            for (i, (o, w)) in out.iter().zip(&want).enumerate() {
                assert!(
                    ((*o as f64) - w).abs() <= 2e-6 * (1.0 + w.abs()),
                    "{isa:?} element {i} (gate {}): {o} vs {w}",
                    g[i]
                );
            }
        }
    }

    #[test]
    fn rope_rotates_pairs_and_preserves_norm() {
        let freqs = [std::f32::consts::FRAC_PI_2, 0.0];
        let mut x = vec![1.0, 0.0, 0.0, 1.0];
        rope(
            &mut x,
            1,
            4,
            &[1],
            Rope {
                inv_freq: &freqs,
                interleaved: false,
                scale: 1.0,
            },
        );
        // pair (0, 2) rotated by 90°, pair (1, 3) by 0.
        assert!((x[0] - 0.0).abs() < 1e-6 && (x[2] - 1.0).abs() < 1e-6);
        assert_eq!((x[1], x[3]), (0.0, 1.0));
        let mut y = vec![1.0, 0.0, 0.0, 1.0];
        rope(
            &mut y,
            1,
            4,
            &[1],
            Rope {
                inv_freq: &freqs,
                interleaved: true,
                scale: 1.0,
            },
        );
        // pair (0, 1) rotated by 90°, pair (2, 3) by 0.
        assert!((y[0] - 0.0).abs() < 1e-6 && (y[1] - 1.0).abs() < 1e-6);
        assert_eq!((y[2], y[3]), (0.0, 1.0));
    }

    /// Partial rotary dimensions (Phi-3): one pair over the first two of six elements, rotate-half
    /// within them, scaled by the attention factor; the other four elements untouched.
    #[test]
    fn rope_rotates_only_the_rotary_part_and_scales_it() {
        let freqs = [std::f32::consts::FRAC_PI_2];
        let mut x = vec![1.0, 0.0, 5.0, 6.0, 7.0, 8.0];
        rope(
            &mut x,
            1,
            6,
            &[1],
            Rope {
                inv_freq: &freqs,
                interleaved: false,
                scale: 2.0,
            },
        );
        assert!(x[0].abs() < 1e-6 && (x[1] - 2.0).abs() < 1e-6, "{x:?}");
        assert_eq!(&x[2..], &[5.0, 6.0, 7.0, 8.0]);
    }

    #[test]
    fn kv_writes_keys_transposed_and_values_as_rows_in_every_element_type() {
        for dtype in [KvDType::F32, KvDType::F16, KvDType::Q8_0] {
            let l = KvLayout {
                num_blocks: 3,
                block_size: 4,
                num_kv_heads: 2,
                head_dim: if dtype == KvDType::Q8_0 { 4 } else { 3 },
                dtype,
            };
            let hd = l.head_dim;
            let (mut kc, mut vc) = (vec![0.0f32; l.storage_words()], vec![0.0f32; l.storage_words()]);
            // Two rows (slots 9 and 2), each with 2 heads × `hd` dims.
            let k: Vec<f32> = (0..4 * hd).map(|i| i as f32 + 0.1).collect();
            let v: Vec<f32> = (0..4 * hd).map(|i| -(i as f32) - 0.1).collect();
            write_kv(&k, &v, &[9, 2], &l, &mut kc, &mut vc);
            // Element `i` of the vector at (b, h, s), as attention reads it.
            let read = |buf: &[f32], i: usize, (b, h, s): (usize, usize, usize)| match dtype {
                KvDType::F32 => buf[i],
                KvDType::F16 => half::f16::from_bits(bytemuck::cast_slice::<f32, u16>(buf)[i]).to_f32(),
                KvDType::Q8_0 => {
                    let (q, sc) = super::super::kv_q8::parts(&l, buf);
                    super::super::kv_q8::dequantize(q[i], sc[l.scale_offset(b, h, s)])
                }
            };
            for (r, slot) in [9usize, 2].into_iter().enumerate() {
                for h in 0..2 {
                    let src = r * 2 * hd + h * hd;
                    // A vector's scale follows its largest element (the last: values grow with `i`).
                    let step = (k[src + hd - 1].abs().max(v[src + hd - 1].abs())) / 127.0;
                    let close = |a: f32, b: f32| match dtype {
                        KvDType::F32 => a == b,
                        KvDType::F16 => a == half::f16::from_f32(b).to_f32(),
                        KvDType::Q8_0 => (a - b).abs() <= step * 0.51,
                    };
                    for d in 0..hd {
                        let (b, s) = (slot / 4, slot % 4);
                        let kr = read(&kc, l.key_offset(b, h, s) + d * 4, (b, h, s));
                        let vr = read(&vc, l.offset(b, h, s) + d, (b, h, s));
                        assert!(
                            close(kr, k[src + d]),
                            "{dtype:?} key {r} {h} {d}: {kr} vs {}",
                            k[src + d]
                        );
                        assert!(
                            close(vr, v[src + d]),
                            "{dtype:?} value {r} {h} {d}: {vr} vs {}",
                            v[src + d]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn softmax_handles_masked_entries() {
        let mut x = [0.0, f32::NEG_INFINITY, 0.0];
        let lz = softmax_in_place(&mut x);
        assert_eq!(x, [0.5, 0.0, 0.5]);
        assert!((lz - 2f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn softmax_of_a_vocabulary_row_matches_f64() {
        // Odd length (vector body and tail), a wide range, masked entries and a NaN-free max.
        let n = 49_157;
        let mut x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 2003) as f32 / 2003.0 - 0.5) * 40.0)
            .collect();
        x[17] = f32::NEG_INFINITY;
        x[n - 1] = 25.0;
        let mx = 25.0f64;
        let z: f64 = x.iter().map(|&v| (v as f64 - mx).exp()).sum();
        let mut y = x.clone();
        let lz = softmax_in_place(&mut y);
        assert!((lz as f64 - z.ln()).abs() < 1e-5, "{lz} vs {}", z.ln());
        for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
            let want = (a as f64 - mx).exp() / z;
            assert!(
                (b as f64 - want).abs() <= 1e-6 * want + 1e-12,
                "{i}: {b} vs {want}"
            );
        }
        assert_eq!(y[17], 0.0);
        assert_eq!(max_lanes(&x), 25.0);
        assert_eq!(max_lanes(&[f32::NAN, -1.0, f32::NAN]), -1.0);
        assert_eq!(max_lanes(&[]), f32::NEG_INFINITY);
    }
}
