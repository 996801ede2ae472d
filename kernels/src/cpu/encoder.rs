//! The kernels an encoder (BERT) needs beside the decoder's: LayerNorm with a bias, exact (erf) GELU,
//! and bidirectional attention within each sequence of a ragged batch — every row of a sequence sees
//! every row of it, and nothing of another sequence.
//!
//! Invariants: as everywhere in this backend, each output element is reduced in an order fixed by its
//! own sequence's inputs (one sequence's rows never depend on another's, nor on the thread count), so
//! an input's embedding is bit-identical alone or in any batch. Formulas follow PyTorch:
//! `LayerNorm(x) = (x − mean) / sqrt(var + eps) · w + b` with the biased variance, two passes in f32;
//! `GELU(x) = x/2 · (1 + erf(x/√2))`.

use super::pool;
use super::simd::{self, Isa, Portable, Simd};
use crate::layout::AttnHeads;
use crate::weight::WeightData;

/// Rows per task for row-wise kernels; below this a single thread is faster.
const MIN_ROWS_PER_TASK: usize = 8;

/// Row-wise LayerNorm of `rows × w.len()` elements.
pub(crate) fn layer_norm(
    x: &[f32],
    w: WeightData<'_>,
    b: WeightData<'_>,
    eps: f32,
    out: &mut [f32],
    rows: usize,
) {
    let dim = w.len();
    let (mut wf, mut bf) = (vec![0.0f32; dim], vec![0.0f32; dim]);
    w.copy_to_f32(0, &mut wf);
    b.copy_to_f32(0, &mut bf);
    pool::for_each_chunk(&mut out[..rows * dim], dim, MIN_ROWS_PER_TASK, |r, o| {
        let xr = &x[r * dim..(r + 1) * dim];
        let mean = xr.iter().fold(0.0f32, |a, v| a + v) / dim as f32;
        let var = xr.iter().fold(0.0f32, |a, v| a + (v - mean) * (v - mean)) / dim as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (((o, v), g), b) in o.iter_mut().zip(xr).zip(&wf).zip(&bf) {
            *o = (v - mean) * inv * g + b;
        }
    });
}

/// `x = GELU(x)` with the exact error function (`simd::gelu_erf`).
pub(crate) fn gelu_erf(isa: Isa, x: &mut [f32]) {
    pool::for_each_chunk(x, 4096, 1, |_, c| {
        // SAFETY: the ISA was detected on this CPU (the backend's invariant).
        unsafe {
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 | Isa::Avx512 => gelu_avx2(c),
                _ => simd::gelu_erf::<Portable>(c),
            }
        }
    });
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gelu_avx2(x: &mut [f32]) {
    // SAFETY: `Avx2` needs AVX2/FMA/F16C, enabled here and guaranteed by our caller.
    unsafe { simd::gelu_erf::<simd::Avx2>(x) }
}

/// Output rows written by disjoint tasks (each task owns one (sequence, head) column block).
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (their own sequence's rows, their own head's columns) of a
// buffer borrowed mutably for the whole loop (see `bidirectional_attention`).
unsafe impl Sync for OutPtr {}

/// Attention of every row of each sequence `(first row, rows)` over all rows of that sequence.
/// `q`/`out` are `rows × num_heads × head_dim`, `k`/`v` `rows × num_kv_heads × head_dim`.
pub(crate) fn bidirectional_attention(
    isa: Isa,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seqs: &[(usize, usize)],
    heads: AttnHeads,
    out: &mut [f32],
) {
    let AttnHeads {
        num_heads,
        num_kv_heads,
        head_dim: d,
        scale,
        ..
    } = heads;
    let (qw, kw) = (num_heads * d, num_kv_heads * d);
    let group = num_heads / num_kv_heads.max(1);
    if let Some(&(s, n)) = seqs.iter().max_by_key(|(s, n)| s + n) {
        assert!(
            (s + n) * qw <= q.len().min(out.len()) && (s + n) * kw <= k.len().min(v.len()),
            "sequence rows {s}..{} exceed the buffers",
            s + n
        );
    }
    let dst = OutPtr(out.as_mut_ptr());
    pool::for_each(seqs.len() * num_heads, |task| {
        // The whole `OutPtr` (which is `Sync`), not its field: a closure would capture just the field.
        let dst = &dst;
        let ((start, len), h) = (seqs[task / num_heads], task % num_heads);
        let t = Task {
            q: &q[start * qw..(start + len) * qw],
            k: &k[start * kw..(start + len) * kw],
            v: &v[start * kw..(start + len) * kw],
            len,
            d,
            q_col: h * d,
            kv_col: (h / group.max(1)) * d,
            qw,
            kw,
            scale,
        };
        // SAFETY: the rows `start..start + len` of `out` at head `h`'s columns are written by this
        // task only (see `OutPtr`), and lie within `out` (checked above).
        let o = unsafe { dst.0.add(start * qw) };
        // SAFETY: the ISA was detected on this CPU (the backend's invariant); `o` as just said.
        unsafe {
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 | Isa::Avx512 => attend_avx2(&t, o),
                _ => attend::<Portable>(&t, o),
            }
        }
    });
}

/// One (sequence, head): its rows of `q`, `k`, `v` (all heads, `qw`/`kw` wide) and where its head's
/// columns are.
struct Task<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    len: usize,
    d: usize,
    q_col: usize,
    kv_col: usize,
    qw: usize,
    kw: usize,
    scale: f32,
}

/// # Safety
/// AVX2, FMA and F16C must be available; `o` as for [`attend`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2(t: &Task<'_>, o: *mut f32) {
    // SAFETY: `Avx2` needs AVX2/FMA/F16C, enabled here and guaranteed by our caller; `o` is passed on.
    unsafe { attend::<simd::Avx2>(t, o) }
}

/// Every row of the task's sequence against all of its keys: scores as `d` axpy passes over the keys
/// transposed (`d × len`, contiguous), the softmax, then the values summed in key order.
///
/// # Safety
/// `S`'s instruction set must be available; `o` points at row 0 of the sequence in the output
/// (`qw` wide), whose columns `q_col..q_col + d` of rows `0..len` only this call writes.
#[inline(always)]
unsafe fn attend<S: Simd>(t: &Task<'_>, o: *mut f32) {
    let (len, d) = (t.len, t.d);
    let mut kt = vec![0.0f32; d * len];
    for j in 0..len {
        let row = &t.k[j * t.kw + t.kv_col..][..d];
        for (i, &x) in row.iter().enumerate() {
            kt[i * len + j] = x;
        }
    }
    let mut scores = vec![0.0f32; len];
    let mut acc = vec![0.0f32; d];
    for i in 0..len {
        let qi = &t.q[i * t.qw + t.q_col..][..d];
        scores.fill(0.0);
        for (dim, &qv) in qi.iter().enumerate() {
            // SAFETY: `S` is available (our contract).
            unsafe { axpy_lanes::<S>(qv * t.scale, &kt[dim * len..(dim + 1) * len], &mut scores) };
        }
        super::elementwise::softmax_in_place(&mut scores);
        acc.fill(0.0);
        for (j, &p) in scores.iter().enumerate() {
            // SAFETY: as above.
            unsafe { axpy_lanes::<S>(p, &t.v[j * t.kw + t.kv_col..][..d], &mut acc) };
        }
        // SAFETY: row `i`, columns `q_col..q_col + d` belong to this call (our contract).
        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), o.add(i * t.qw + t.q_col), d) };
    }
}

/// `y += a · x` with `S`'s lanes (each element one multiply-add: the order cannot vary).
///
/// # Safety
/// `S`'s instruction set must be available.
#[inline(always)]
unsafe fn axpy_lanes<S: Simd>(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let whole = n - n % 8;
    // SAFETY: `S` is available (our contract); every load and store is within `x[..whole]` and
    // `y[..whole]`.
    unsafe {
        let av = S::splat(a);
        for i in (0..whole).step_by(8) {
            let r = S::mul_add(av, S::load(x.as_ptr().add(i)), S::load(y.as_ptr().add(i)));
            S::store(y.as_mut_ptr().add(i), r);
        }
    }
    for (y, x) in y[whole..n].iter_mut().zip(&x[whole..n]) {
        *y = a.mul_add(*x, *y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weight::HostWeight;

    fn heads(n: usize, d: usize) -> AttnHeads {
        AttnHeads {
            num_heads: n,
            num_kv_heads: n,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            window: None,
        }
    }

    /// Plain attention of one sequence, f64.
    fn reference(q: &[f32], k: &[f32], v: &[f32], rows: usize, n: usize, d: usize) -> Vec<f32> {
        let w = n * d;
        let mut out = vec![0.0f32; rows * w];
        for h in 0..n {
            for i in 0..rows {
                let s: Vec<f64> = (0..rows)
                    .map(|j| {
                        (0..d)
                            .map(|x| q[i * w + h * d + x] as f64 * k[j * w + h * d + x] as f64)
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for x in 0..d {
                    let acc: f64 = (0..rows).map(|j| e[j] / z * v[j * w + h * d + x] as f64).sum();
                    out[i * w + h * d + x] = acc as f32;
                }
            }
        }
        out
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn attention_matches_plain_attention_and_is_the_same_alone_or_batched() {
        let (n, d) = (3, 20);
        let w = n * d;
        let lens = [5usize, 1, 17];
        let total: usize = lens.iter().sum();
        let (q, k, v) = (data(total * w, 1), data(total * w, 2), data(total * w, 3));
        let mut seqs = Vec::new();
        let mut start = 0;
        for &l in &lens {
            seqs.push((start, l));
            start += l;
        }
        for isa in [Isa::Portable, Isa::detect()] {
            let mut batched = vec![0.0f32; total * w];
            bidirectional_attention(isa, &q, &k, &v, &seqs, heads(n, d), &mut batched);
            for &(s, l) in &seqs {
                let r = s * w..(s + l) * w;
                let want = reference(&q[r.clone()], &k[r.clone()], &v[r.clone()], l, n, d);
                for (a, b) in batched[r.clone()].iter().zip(&want) {
                    assert!((a - b).abs() < 1e-5, "{a} vs {b}");
                }
                let mut alone = vec![0.0f32; l * w];
                let (qa, ka, va) = (&q[r.clone()], &k[r.clone()], &v[r.clone()]);
                bidirectional_attention(isa, qa, ka, va, &[(0, l)], heads(n, d), &mut alone);
                assert_eq!(alone, batched[r], "sequence at row {s} alone vs batched");
            }
        }
    }

    #[test]
    fn layer_norm_and_gelu_follow_their_formulas() {
        let x = [1.0f32, 2.0, 3.0, 4.0, -2.0, 0.0, 2.0, 8.0];
        let w = HostWeight::from_f32(&[1.0, 2.0, 0.5, 1.0], 1, 4).unwrap();
        let b = HostWeight::from_f32(&[0.0, 1.0, 0.0, -1.0], 1, 4).unwrap();
        let mut out = [0.0f32; 8];
        layer_norm(&x, w.data(), b.data(), 1e-12, &mut out, 2);
        for (r, row) in x.chunks(4).enumerate() {
            let mean = row.iter().sum::<f32>() / 4.0;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0;
            let ws = [1.0, 2.0, 0.5, 1.0];
            let bs = [0.0, 1.0, 0.0, -1.0];
            for i in 0..4 {
                let want = (row[i] - mean) / (var + 1e-12).sqrt() * ws[i] + bs[i];
                assert!((out[r * 4 + i] - want).abs() < 1e-5);
            }
        }
        let mut g = [-3.0f32, -1.0, 0.0, 0.5, 2.0];
        gelu_erf(Isa::detect(), &mut g);
        let mut p = [-3.0f32, -1.0, 0.0, 0.5, 2.0];
        gelu_erf(Isa::Portable, &mut p);
        // PyTorch's `gelu` (erf) at those points.
        let want = [-0.004049696, -0.15865526, 0.0, 0.34573123, 1.9544997];
        for (a, b) in g.iter().chain(&p).zip(want.iter().chain(&want)) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}
