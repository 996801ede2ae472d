//! The 8-bit KV cache ([`KvDType::Q8_0`]): how its backend buffer is split into the `i8` elements and
//! the f16 scales, and how one head vector is quantized when written.
//!
//! Invariants: a buffer holds `layout.len()` bytes of elements in the paged layout (keys transposed,
//! values as rows: [`KvLayout`]), then `layout.num_vectors()` f16 scales at
//! [`KvLayout::scale_offset`]; a vector `x` is stored as `q = round(x / s)` clamped to ±127 with
//! `s = f16(max|x| / 127)` (the scale rounded first, so the stored pair reconstructs `q · s` exactly as
//! attention reads it), and an all-zero vector as zeros with scale 0.

use crate::layout::{KvDType, KvLayout};

/// The elements and the scales of an 8-bit cache buffer.
pub(crate) fn parts<'a>(layout: &KvLayout, buf: &'a [f32]) -> (&'a [i8], &'a [u16]) {
    check(layout, buf.len());
    let bytes: &[u8] = bytemuck::cast_slice(buf);
    let (elems, scales) = bytes.split_at(layout.len());
    (
        bytemuck::cast_slice(elems),
        bytemuck::cast_slice(&scales[..2 * layout.num_vectors()]),
    )
}

/// [`parts`], writable.
pub(crate) fn parts_mut<'a>(layout: &KvLayout, buf: &'a mut [f32]) -> (&'a mut [i8], &'a mut [u16]) {
    check(layout, buf.len());
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
    let (elems, scales) = bytes.split_at_mut(layout.len());
    (
        bytemuck::cast_slice_mut(elems),
        bytemuck::cast_slice_mut(&mut scales[..2 * layout.num_vectors()]),
    )
}

fn check(layout: &KvLayout, words: usize) {
    assert_eq!(layout.dtype, KvDType::Q8_0, "an 8-bit KV cache");
    // The scales start right after the elements: on a 2-byte boundary only for an even head_dim.
    assert!(
        layout.head_dim.is_multiple_of(2),
        "an 8-bit KV cache needs an even head_dim, not {}",
        layout.head_dim
    );
    assert!(words >= layout.storage_words(), "cache shorter than its layout");
}

/// The scale (f16 bits) of vector `x` and its elements into `out` (`x.len()` of them, in order).
pub(crate) fn quantize(x: &[f32], mut out: impl FnMut(usize, i8)) -> u16 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = half::f16::from_f32(amax / 127.0).min(half::f16::MAX);
    let s = scale.to_f32();
    for (d, &v) in x.iter().enumerate() {
        let q = if s > 0.0 {
            (v / s).round().clamp(-127.0, 127.0) as i8
        } else {
            0
        };
        out(d, q);
    }
    scale.to_bits()
}

/// Element `q` of a vector with scale bits `scale`, as attention reads it.
#[cfg(test)]
pub(crate) fn dequantize(q: i8, scale: u16) -> f32 {
    q as f32 * half::f16::from_bits(scale).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_round_trips_within_half_a_step_and_zeros_stay_zero() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32 - 31.5) * 0.13).collect();
        let mut q = vec![0i8; 64];
        let s = quantize(&x, |d, v| q[d] = v);
        let step = half::f16::from_bits(s).to_f32();
        assert!(
            q.iter().any(|&v| v.abs() == 127),
            "the largest element uses the whole range"
        );
        for (a, &b) in x.iter().zip(&q) {
            assert!(
                (a - dequantize(b, s)).abs() <= step / 2.0 + 1e-6,
                "{a} vs {}",
                dequantize(b, s)
            );
        }
        let mut z = vec![1i8; 8];
        assert_eq!(quantize(&[0.0; 8], |d, v| z[d] = v), 0);
        assert_eq!(z, vec![0; 8]);
    }
}
