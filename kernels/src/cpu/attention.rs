//! Paged causal attention on the CPU: each (row, query head) walks its sequence's blocks in position
//! order with an online (running-max) softmax, never materialising the attention matrix.
//!
//! Invariants: the query at position `p` attends to positions `0..=p` of its own sequence only; the
//! walk is in position order in chunks of at most [`CHUNK`] positions that never straddle a block, so
//! the arithmetic for one (row, head) depends only on that row's query and the cached K/V — not on the
//! batch, the other rows of a prefill chunk, or thread scheduling. A token's output is therefore the same
//! whether it was computed in a prefill chunk or as a decode step.
//!
//! Design: the CPU analogue of FlashAttention's / vLLM PagedAttention's inner loop (Dao et al. 2022;
//! Kwon et al. 2023): scores for a chunk, rescale the running sum and accumulator by `exp(m_old -
//! m_new)`, accumulate `exp(s - m_new) · v`.

use super::pool;
use super::simd::{self, Isa, Portable, Simd};
use crate::layout::{AttnHeads, AttnSeq, KvLayout};

/// Positions scored at a time (one online-softmax update).
const CHUNK: usize = 32;

/// What one (row, head) task needs.
struct Task<'a> {
    q: &'a [f32],
    block_table: &'a [u32],
    pos: usize,
    kv_head: usize,
    layout: &'a KvLayout,
    k_cache: &'a [f32],
    v_cache: &'a [f32],
    scale: f32,
}

impl Task<'_> {
    /// The chunk of the walk that starts at position `start`: its length (≤ [`CHUNK`], within one
    /// block, not past this row's position) and the cache offset of its first key or value.
    fn chunk(&self, start: usize) -> (usize, usize) {
        let bs = self.layout.block_size;
        let block = self.block_table[start / bs] as usize;
        let slot0 = start % bs;
        let len = (self.pos + 1 - start).min(bs - slot0).min(CHUNK);
        (len, self.layout.offset(block, self.kv_head, slot0))
    }

    /// Asks for the values of the chunk at `base` (`len` positions) and the keys of the chunk that
    /// starts at `next`: the walk jumps from block to block of the paged cache, which the hardware
    /// prefetchers only pick up a few lines into each block.
    #[inline(always)]
    fn prefetch<S: Simd>(&self, next: usize, base: usize, len: usize) {
        let hd = self.layout.head_dim;
        let lines = |cache: &[f32], at: usize, n: usize| {
            for off in (0..n * hd).step_by(16) {
                S::prefetch(cache.as_ptr().wrapping_add(at + off).cast());
            }
        };
        lines(self.v_cache, base, len);
        if next <= self.pos {
            let (n, at) = self.chunk(next);
            lines(self.k_cache, at, n);
        }
    }
}

/// Runs attention for every new row of every sequence; `q` and `out` are `rows × num_heads × head_dim`.
pub(crate) fn paged_attention(
    isa: Isa,
    q: &[f32],
    seqs: &[AttnSeq<'_>],
    heads: AttnHeads,
    layout: &KvLayout,
    (k_cache, v_cache): (&[f32], &[f32]),
    out: &mut [f32],
) {
    let hd = heads.head_dim;
    assert_eq!(hd, layout.head_dim, "head_dim of the cache");
    assert_eq!(heads.num_kv_heads, layout.num_kv_heads, "kv heads of the cache");
    let group = heads.num_heads / heads.num_kv_heads;
    // Row -> (sequence, position).
    let rows: usize = seqs.iter().map(|s| s.row_start + s.num_rows).max().unwrap_or(0);
    let mut row_seq = vec![(usize::MAX, 0usize); rows];
    for (i, s) in seqs.iter().enumerate() {
        assert!(
            s.block_table.len() * layout.block_size >= s.first_pos + s.num_rows,
            "block table too short"
        );
        for j in 0..s.num_rows {
            row_seq[s.row_start + j] = (i, s.first_pos + j);
        }
    }
    let width = heads.num_heads * hd;
    // With 32 vector registers (AVX-512), the query heads that share a KV head run as one task that
    // reads each cached key and value once for all of them (the per-head arithmetic is unchanged).
    let grouped = isa == Isa::Avx512 && group > 1 && hd == 64;
    let per_task = if grouped { group } else { 1 };
    pool::for_each_chunk(&mut out[..rows * width], per_task * hd, 1, |idx, acc| {
        let tasks_per_row = heads.num_heads / per_task;
        let (row, head) = (idx / tasks_per_row, idx % tasks_per_row * per_task);
        let (seq, pos) = row_seq[row];
        if seq == usize::MAX {
            acc.fill(0.0);
            return;
        }
        let first = row * width + head * hd;
        let task = Task {
            q: &q[first..first + per_task * hd],
            block_table: seqs[seq].block_table,
            pos,
            kv_head: head / group,
            layout,
            k_cache,
            v_cache,
            scale: heads.scale,
        };
        // SAFETY: the ISA was detected on this CPU; slices are bounds-checked inside.
        unsafe { run(isa, grouped, &task, acc) }
    });
}

/// One task: one query head, or (`grouped`, AVX-512 only) every query head of one KV head.
unsafe fn run(isa: Isa, grouped: bool, task: &Task<'_>, acc: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if grouped => unsafe { group_avx512(task, acc) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => unsafe { run_avx2(task, acc) },
        _ => unsafe { one_head::<Portable>(task, acc) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2(task: &Task<'_>, acc: &mut [f32]) {
    unsafe { one_head::<simd::Avx2>(task, acc) }
}

/// The query heads of one KV head (`t.q` holds them all; `out` is as long), `head_dim` 64, in pieces
/// of up to three heads: three queries (24 vectors) fit the 32 registers AVX-512VL gives 8-lane code.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn group_avx512(t: &Task<'_>, out: &mut [f32]) {
    const HD: usize = 64;
    let heads = t.q.len() / HD;
    let mut h = 0;
    while h < heads {
        let n = (heads - h).min(3);
        let piece = Task {
            q: &t.q[h * HD..(h + n) * HD],
            ..*t
        };
        let o = &mut out[h * HD..(h + n) * HD];
        // SAFETY: AVX2 is implied by the detected AVX-512 ISA.
        unsafe {
            match n {
                1 => heads_fixed::<simd::Avx2, 8, 1, 4>(&piece, o),
                2 => heads_fixed::<simd::Avx2, 8, 2, 2>(&piece, o),
                _ => heads_fixed::<simd::Avx2, 8, 3, 2>(&piece, o),
            }
        }
        h += n;
    }
}

/// [`one_head`] for `G` query heads of one KV head at once and `head_dim == 8 · V`: the queries and the
/// output rows stay in registers, every key and value vector is loaded once for the `G` heads, and `K`
/// keys are scored side by side (`K · G` independent chains). Each head's operations are exactly the
/// general walk's ([`one_head_any`]), so the results are bit-identical (tested).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // several arrays indexed by the same (head, key, lane) indices
unsafe fn heads_fixed<S: Simd, const V: usize, const G: usize, const K: usize>(
    t: &Task<'_>,
    out: &mut [f32],
) {
    let hd = 8 * V;
    unsafe {
        let mut qv = [[S::zero(); V]; G];
        for (g, qg) in qv.iter_mut().enumerate() {
            for (j, v) in qg.iter_mut().enumerate() {
                *v = S::load(t.q.as_ptr().add(g * hd + 8 * j));
            }
        }
        let mut acc = [[S::zero(); V]; G];
        let mut m = [f32::NEG_INFINITY; G];
        let mut l = [0.0f32; G];
        let mut scores = [[0.0f32; CHUNK]; G];
        let mut probs = [[0.0f32; CHUNK]; G];
        let n_ctx = t.pos + 1;
        let mut start = 0;
        while start < n_ctx {
            let (len, base) = t.chunk(start);
            t.prefetch::<S>(start + len, base, len);
            let keys = &t.k_cache[base..base + len * hd];
            let mut i = 0;
            while i < len {
                let n = (len - i).min(K);
                let mut d = [[S::zero(); K]; G];
                for j in 0..V {
                    for kk in 0..n {
                        let kv = S::load(keys.as_ptr().add((i + kk) * hd + 8 * j));
                        for g in 0..G {
                            d[g][kk] = S::mul_add(qv[g][j], kv, d[g][kk]);
                        }
                    }
                }
                for g in 0..G {
                    for kk in 0..n {
                        // `+ 0.0`: `simd::dot` adds its (empty) tail.
                        scores[g][i + kk] = (S::hsum(d[g][kk]) + 0.0) * t.scale;
                    }
                }
                i += n;
            }
            for g in 0..G {
                let cmax = scores[g][..len].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let m_new = m[g].max(cmax);
                let corr = (m[g] - m_new).exp();
                l[g] *= corr;
                for a in acc[g].iter_mut() {
                    *a = S::mul(S::splat(corr), *a);
                }
                simd::exp_shifted::<S>(&scores[g][..len], m_new, &mut probs[g][..len]);
                for &p in &probs[g][..len] {
                    l[g] += p;
                }
                m[g] = m_new;
            }
            let vals = &t.v_cache[base..base + len * hd];
            for i in 0..len {
                for j in 0..V {
                    let vv = S::load(vals.as_ptr().add(i * hd + 8 * j));
                    for g in 0..G {
                        acc[g][j] = S::mul_add(S::splat(probs[g][i]), vv, acc[g][j]);
                    }
                }
            }
            start += len;
        }
        for g in 0..G {
            let inv = S::splat(1.0 / l[g]);
            for j in 0..V {
                S::store(out.as_mut_ptr().add(g * hd + 8 * j), S::mul(inv, acc[g][j]));
            }
        }
    }
}

#[inline(always)]
unsafe fn one_head<S: Simd>(t: &Task<'_>, acc: &mut [f32]) {
    // Common head sizes keep the query and the accumulator in registers; the arithmetic is the same.
    unsafe {
        match t.layout.head_dim {
            64 => heads_fixed::<S, 8, 1, 4>(t, acc),
            128 => heads_fixed::<S, 16, 1, 4>(t, acc),
            _ => one_head_any::<S>(t, acc),
        }
    }
}

/// [`one_head`] for any head size.
#[inline(always)]
unsafe fn one_head_any<S: Simd>(t: &Task<'_>, acc: &mut [f32]) {
    let hd = t.layout.head_dim;
    acc.fill(0.0);
    let mut m = f32::NEG_INFINITY;
    let mut l = 0.0f32;
    let mut scores = [0.0f32; CHUNK];
    let n_ctx = t.pos + 1;
    let mut start = 0;
    while start < n_ctx {
        let (len, base) = t.chunk(start);
        let mut cmax = f32::NEG_INFINITY;
        for (i, s) in scores[..len].iter_mut().enumerate() {
            let k = &t.k_cache[base + i * hd..base + (i + 1) * hd];
            *s = unsafe { simd::dot::<S>(t.q, k) } * t.scale;
            cmax = cmax.max(*s);
        }
        let m_new = m.max(cmax);
        let corr = (m - m_new).exp();
        l *= corr;
        unsafe { simd::scale::<S>(corr, acc) };
        let mut probs = [0.0f32; CHUNK];
        unsafe { simd::exp_shifted::<S>(&scores[..len], m_new, &mut probs[..len]) };
        for (i, &p) in probs[..len].iter().enumerate() {
            l += p;
            let v = &t.v_cache[base + i * hd..base + (i + 1) * hd];
            unsafe { simd::axpy::<S>(p, v, acc) };
        }
        m = m_new;
        start += len;
    }
    unsafe { simd::scale::<S>(1.0 / l, acc) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in [-2, 2).
    fn lcg(seed: u64, n: usize) -> Vec<f32> {
        crate::cpu::test_data::lcg(seed, n)
            .into_iter()
            .map(|v| v * 4.0)
            .collect()
    }

    /// Dense reference: full softmax over positions 0..=pos, in f64.
    fn reference(q: &[f32], keys: &[Vec<f32>], vals: &[Vec<f32>], scale: f32) -> Vec<f32> {
        let s: Vec<f64> = keys
            .iter()
            .map(|k| q.iter().zip(k).map(|(a, b)| (a * b) as f64).sum::<f64>() * scale as f64)
            .collect();
        let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..q.len())
            .map(|d| (e.iter().zip(vals).map(|(p, v)| p * v[d] as f64).sum::<f64>() / z) as f32)
            .collect()
    }

    #[test]
    fn matches_dense_softmax_attention_with_gqa_and_scattered_blocks() {
        let layout = KvLayout {
            num_blocks: 8,
            block_size: 4,
            num_kv_heads: 2,
            head_dim: 8,
        };
        let heads = AttnHeads {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            scale: 0.35,
        };
        let table = [5u32, 1, 6]; // 10 tokens over three scattered blocks
        let n = 10;
        let (kv, qs) = (lcg(7, n * 2 * 8 * 2), lcg(8, n * 4 * 8));
        let mut kc = vec![0.0; layout.len()];
        let mut vc = vec![0.0; layout.len()];
        let key = |p: usize, h: usize| kv[(p * 2 + h) * 16..(p * 2 + h) * 16 + 8].to_vec();
        let val = |p: usize, h: usize| kv[(p * 2 + h) * 16 + 8..(p * 2 + h) * 16 + 16].to_vec();
        for p in 0..n {
            for h in 0..2 {
                let off = layout.offset(table[p / 4] as usize, h, p % 4);
                kc[off..off + 8].copy_from_slice(&key(p, h));
                vc[off..off + 8].copy_from_slice(&val(p, h));
            }
        }
        // Rows 0..7 are a prefill chunk at positions 3..10 (positions 0..3 cached earlier).
        let seqs = [AttnSeq {
            row_start: 0,
            num_rows: 7,
            first_pos: 3,
            block_table: &table,
        }];
        let mut out = vec![0.0; 7 * 32];
        for isa in [Isa::Portable, Isa::detect()] {
            paged_attention(isa, &qs[..7 * 32], &seqs, heads, &layout, (&kc, &vc), &mut out);
            for r in 0..7 {
                let pos = 3 + r;
                for h in 0..4 {
                    let q = &qs[r * 32 + h * 8..r * 32 + h * 8 + 8];
                    let keys: Vec<_> = (0..=pos).map(|p| key(p, h / 2)).collect();
                    let vals: Vec<_> = (0..=pos).map(|p| val(p, h / 2)).collect();
                    let want = reference(q, &keys, &vals, 0.35);
                    for (a, b) in out[r * 32 + h * 8..r * 32 + h * 8 + 8].iter().zip(&want) {
                        assert!((a - b).abs() < 1e-5, "{isa:?} row {r} head {h}: {a} vs {b}");
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn both_avx2<const V: usize>(t: &Task<'_>, a: &mut [f32], b: &mut [f32]) {
        unsafe {
            heads_fixed::<simd::Avx2, V, 1, 4>(t, a);
            one_head_any::<simd::Avx2>(t, b);
        }
    }

    #[test]
    fn register_resident_heads_match_the_general_walk_bit_for_bit() {
        for hd in [64, 128] {
            let layout = KvLayout {
                num_blocks: 6,
                block_size: 16,
                num_kv_heads: 1,
                head_dim: hd,
            };
            let kc = lcg(11, layout.len());
            let vc = lcg(12, layout.len());
            let q = lcg(13, hd);
            let table = [4u32, 0, 5, 2];
            for pos in [0, 5, 16, 37, 63] {
                let t = Task {
                    q: &q,
                    block_table: &table,
                    pos,
                    kv_head: 0,
                    layout: &layout,
                    k_cache: &kc,
                    v_cache: &vc,
                    scale: 0.125,
                };
                let (mut a, mut b) = (vec![0.0; hd], vec![0.0; hd]);
                // SAFETY: plain Rust lanes.
                unsafe {
                    match hd {
                        64 => heads_fixed::<Portable, 8, 1, 4>(&t, &mut a),
                        _ => heads_fixed::<Portable, 16, 1, 4>(&t, &mut a),
                    }
                    one_head_any::<Portable>(&t, &mut b);
                }
                assert_eq!(a, b, "portable, head_dim {hd}, position {pos}");
                #[cfg(target_arch = "x86_64")]
                if Isa::detect().has_avx2() {
                    // SAFETY: AVX2 detected.
                    unsafe {
                        match hd {
                            64 => both_avx2::<8>(&t, &mut a, &mut b),
                            _ => both_avx2::<16>(&t, &mut a, &mut b),
                        }
                    }
                    assert_eq!(a, b, "AVX2, head_dim {hd}, position {pos}");
                    let keys: Vec<Vec<f32>> = (0..=pos)
                        .map(|p| {
                            let o = layout.offset(table[p / 16] as usize, 0, p % 16);
                            kc[o..o + hd].to_vec()
                        })
                        .collect();
                    let vals: Vec<Vec<f32>> = (0..=pos)
                        .map(|p| {
                            let o = layout.offset(table[p / 16] as usize, 0, p % 16);
                            vc[o..o + hd].to_vec()
                        })
                        .collect();
                    let want = reference(&q, &keys, &vals, 0.125);
                    for (x, y) in a.iter().zip(&want) {
                        assert!((x - y).abs() < 1e-4, "head_dim {hd} position {pos}: {x} vs {y}");
                    }
                }
            }
        }
    }

    #[test]
    fn grouped_heads_match_one_head_at_a_time_bit_for_bit() {
        if Isa::detect() != Isa::Avx512 {
            return;
        }
        // SmolLM2's 9 heads over 3 KV heads, and Qwen2-0.5B's 14 over 2 (pieces of 3, 3 and 1).
        for (num_heads, num_kv_heads) in [(9, 3), (14, 2)] {
            let hd = 64;
            let layout = KvLayout {
                num_blocks: 6,
                block_size: 16,
                num_kv_heads,
                head_dim: hd,
            };
            let heads = AttnHeads {
                num_heads,
                num_kv_heads,
                head_dim: hd,
                scale: 0.125,
            };
            let (kc, vc) = (lcg(21, layout.len()), lcg(22, layout.len()));
            let table = [3u32, 0, 5, 1];
            // A decode row at position 50 and a 3-row prefill chunk at 20..23.
            let seqs = [
                AttnSeq {
                    row_start: 0,
                    num_rows: 1,
                    first_pos: 50,
                    block_table: &table,
                },
                AttnSeq {
                    row_start: 1,
                    num_rows: 3,
                    first_pos: 20,
                    block_table: &table,
                },
            ];
            let q = lcg(23, 4 * num_heads * hd);
            let mut grouped = vec![0.0; 4 * num_heads * hd];
            let mut single = vec![0.0; 4 * num_heads * hd];
            paged_attention(Isa::Avx512, &q, &seqs, heads, &layout, (&kc, &vc), &mut grouped);
            paged_attention(Isa::Avx2, &q, &seqs, heads, &layout, (&kc, &vc), &mut single);
            assert_eq!(grouped, single, "{num_heads} heads over {num_kv_heads}");
        }
    }
}
