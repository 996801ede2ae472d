//! Paged causal attention on the CPU: each (row, KV head) task walks its sequence's blocks in position
//! order with an online (running-max) softmax for every query head of that KV head, never
//! materialising the attention matrix.
//!
//! Invariants: the query at position `p` attends to positions `0..=p` of its own sequence only; the
//! walk is in position order in chunks of at most [`CHUNK`] positions that never straddle a block, so
//! the arithmetic for one (row, head) depends only on that row's query and the cached K/V — not on the
//! batch, the other rows of a prefill chunk, or thread scheduling. A token's output is therefore the same
//! whether it was computed in a prefill chunk or as a decode step. Every quantity is a per-element chain
//! in a fixed order, so 8-lane (AVX2), 16-lane (AVX-512) and scalar code give the same bits:
//! - a score is `s = fma(q[d], k[d], s)` for `d = 0..head_dim` in order from 0, then `s · scale`; the
//!   keys are stored transposed within a block ([`KvLayout::key_offset`]), so a vector register holds one
//!   dimension of consecutive keys and scores W keys at once, with no horizontal sums;
//! - per chunk: `m' = max(m, scores)`, `l = l · e^(m − m') + Σ p` (the `p = e^(s − m')` added in order),
//!   `acc = acc · e^(m − m')`, then `acc[d] = fma(p_i, v_i[d], acc[d])` for the chunk's keys in order;
//! - finally `out = acc · (1 / l)`.
//!
//! Design: the CPU analogue of FlashAttention's / vLLM PagedAttention's inner loop (Dao et al. 2022;
//! Kwon et al. 2023; vLLM also keeps keys and values in different layouts). The query heads that share
//! a KV head run together, so each cached key and value is loaded once for all of them, and two chunks'
//! scores are computed together for more independent chains.

use super::pool;
use super::simd::{self, Isa, Portable, Simd};
use crate::layout::{AttnHeads, AttnSeq, KvDType, KvLayout};

/// Positions scored at a time (one online-softmax update).
const CHUNK: usize = 32;

/// Most query heads one pass handles (larger groups run in pieces).
const MAX_G: usize = 4;

/// What one (row, KV head) task needs; `E` is the cache's element (`f32`, or `u16` holding f16 bits).
struct Task<'a, E> {
    /// The query heads of this KV head, one after another.
    q: &'a [f32],
    block_table: &'a [u32],
    pos: usize,
    kv_head: usize,
    layout: &'a KvLayout,
    k_cache: &'a [E],
    v_cache: &'a [E],
    scale: f32,
}

/// A piece of the walk: `len` positions from slot `slot0` of one block, with the cache offsets of its
/// first key (transposed layout) and first value.
#[derive(Clone, Copy)]
struct Chunk {
    len: usize,
    slot0: usize,
    k: usize,
    v: usize,
}

impl<E> Task<'_, E> {
    /// The chunk of the walk that starts at position `start`: at most [`CHUNK`] positions, within one
    /// block, not past this row's position.
    fn chunk(&self, start: usize) -> Chunk {
        let bs = self.layout.block_size;
        let block = self.block_table[start / bs] as usize;
        let slot0 = start % bs;
        Chunk {
            len: (self.pos + 1 - start).min(bs - slot0).min(CHUNK),
            slot0,
            k: self.layout.key_offset(block, self.kv_head, slot0),
            v: self.layout.offset(block, self.kv_head, slot0),
        }
    }

    /// Asks for the keys of `c` (one line per dimension and 16 positions) and, with `values`, its
    /// values: the walk jumps from block to block of the paged cache, which the hardware prefetchers
    /// only pick up a few lines into each block.
    #[inline(always)]
    fn prefetch<S: Simd>(&self, c: Chunk, values: bool) {
        let (hd, bs) = (self.layout.head_dim, self.layout.block_size);
        for d in 0..hd {
            for off in (0..c.len).step_by(16) {
                S::prefetch(self.k_cache.as_ptr().wrapping_add(c.k + d * bs + off).cast());
            }
        }
        if values {
            for off in (0..c.len * hd).step_by(16) {
                S::prefetch(self.v_cache.as_ptr().wrapping_add(c.v + off).cast());
            }
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
    assert!(
        k_cache.len() >= layout.storage_words() && v_cache.len() >= layout.storage_words(),
        "cache shorter than its layout"
    );
    match layout.dtype {
        KvDType::F32 => attend(isa, q, seqs, heads, layout, (k_cache, v_cache), out),
        KvDType::F16 => attend::<u16>(
            isa,
            q,
            seqs,
            heads,
            layout,
            (bytemuck::cast_slice(k_cache), bytemuck::cast_slice(v_cache)),
            out,
        ),
    }
}

/// [`paged_attention`] on a cache of `E` elements.
fn attend<E: KvElem>(
    isa: Isa,
    q: &[f32],
    seqs: &[AttnSeq<'_>],
    heads: AttnHeads,
    layout: &KvLayout,
    (k_cache, v_cache): (&[E], &[E]),
    out: &mut [f32],
) {
    let hd = heads.head_dim;
    let group = heads.num_heads / heads.num_kv_heads;
    // Row -> (sequence, position).
    let rows: usize = seqs.iter().map(|s| s.row_start + s.num_rows).max().unwrap_or(0);
    let mut row_seq = vec![(usize::MAX, 0usize); rows];
    for (i, s) in seqs.iter().enumerate() {
        assert!(
            s.block_table.len() * layout.block_size >= s.first_pos + s.num_rows,
            "block table too short"
        );
        assert!(
            s.block_table.iter().all(|&b| (b as usize) < layout.num_blocks),
            "block outside the cache"
        );
        for j in 0..s.num_rows {
            row_seq[s.row_start + j] = (i, s.first_pos + j);
        }
    }
    let width = heads.num_heads * hd;
    pool::for_each_chunk(&mut out[..rows * width], group * hd, 1, |idx, acc| {
        let (row, kv_head) = (idx / heads.num_kv_heads, idx % heads.num_kv_heads);
        let (seq, pos) = row_seq[row];
        if seq == usize::MAX {
            acc.fill(0.0);
            return;
        }
        let first = row * width + kv_head * group * hd;
        let task = Task {
            q: &q[first..first + group * hd],
            block_table: seqs[seq].block_table,
            pos,
            kv_head,
            layout,
            k_cache,
            v_cache,
            scale: heads.scale,
        };
        // Query heads in pieces of at most MAX_G.
        let mut h = 0;
        while h < group {
            let n = (group - h).min(MAX_G);
            let piece = Task {
                q: &task.q[h * hd..(h + n) * hd],
                ..task
            };
            // SAFETY: the ISA was detected on this CPU; the cache offsets were checked above (block
            // ids, layout length) and every read stays within one block of one head.
            unsafe { run(isa, n, &piece, &mut acc[h * hd..(h + n) * hd]) };
            h += n;
        }
    });
}

/// `n ≤ MAX_G` query heads of one KV head with the widest lanes of `isa`.
///
/// # Safety
/// This CPU has `isa`'s extensions (`Isa`'s invariant); `1 ≤ n ≤ MAX_G` and `t.q` holds exactly `n`
/// heads (`n · head_dim` values); `t` meets the rest of [`heads`]' contract.
unsafe fn run<E: KvElem>(isa: Isa, n: usize, t: &Task<'_, E>, out: &mut [f32]) {
    macro_rules! by_heads {
        ($f:ident) => {
            match n {
                1 => $f::<E, 1>(t, out),
                2 => $f::<E, 2>(t, out),
                3 => $f::<E, 3>(t, out),
                _ => $f::<E, 4>(t, out),
            }
        };
    }
    // SAFETY: `Isa::Avx512` / `Isa::Avx2` are only held where their extensions were found (our
    // contract), which covers what `run_avx512` / `run_avx2` enable; `by_heads!` picks `G = n` for
    // `n` in 1..=MAX_G, so `t.q` holds the `G` heads `heads` expects, and its other terms are ours.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => by_heads!(run_avx512),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => by_heads!(run_avx2),
            _ => by_heads!(run_portable),
        }
    }
}

/// # Safety
/// As for [`heads`] (no CPU extension needed).
unsafe fn run_portable<E: KvElem, const G: usize>(t: &Task<'_, E>, out: &mut [f32]) {
    // SAFETY: the portable lanes need no CPU extension; the rest of `heads`' contract is ours.
    unsafe { heads::<Eight<Portable>, Portable, E, G, 2>(t, out) }
}

/// # Safety
/// AVX2, FMA and F16C must be available; otherwise as for [`heads`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<E: KvElem, const G: usize>(t: &Task<'_, E>, out: &mut [f32]) {
    // SAFETY: `Eight<Avx2>` and `Avx2`'s exponential need AVX2/FMA/F16C, which this function enables
    // and our caller guarantees (`# Safety`); the rest of `heads`' contract is ours.
    unsafe { heads::<Eight<simd::Avx2>, simd::Avx2, E, G, 2>(t, out) }
}

/// # Safety
/// AVX-512F/VL, AVX2, FMA and F16C must be available; otherwise as for [`heads`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn run_avx512<E: KvElem, const G: usize>(t: &Task<'_, E>, out: &mut [f32]) {
    // SAFETY: `Sixteen` needs AVX-512F and `Avx2`'s exponential AVX2/FMA/F16C, all enabled here and
    // guaranteed by our caller (`# Safety`); the rest of `heads`' contract is ours.
    unsafe { heads::<Sixteen, simd::Avx2, E, G, 4>(t, out) }
}

/// The vector registers the kernel runs on: `W` f32 lanes.
///
/// # Safety
/// Every `unsafe fn` here needs the implementation's instruction set: `Eight<S>` that of `S` (see
/// [`Simd`]), [`Sixteen`] AVX-512F (the tiles run inside `run_avx512`). The pointer methods also need
/// the memory of their `W` lanes (any alignment).
trait Lanes: Copy {
    const W: usize;
    type V: Copy;
    /// All lanes zero.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available (see [`Lanes`]).
    unsafe fn zero() -> Self::V;
    /// All lanes `x`.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn splat(x: f32) -> Self::V;
    /// `W` f32 from `p`.
    ///
    /// # Safety
    /// `p..p + W` must be readable (any alignment); `Self`'s instruction set available.
    unsafe fn load(p: *const f32) -> Self::V;
    /// `W` f16 (as bits) from `p`, widened exactly.
    ///
    /// # Safety
    /// `p..p + W` must be readable (any alignment); `Self`'s instruction set available.
    unsafe fn load_f16(p: *const u16) -> Self::V;
    /// `W` f32 to `p`.
    ///
    /// # Safety
    /// `p..p + W` must be writable (any alignment); `Self`'s instruction set available.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a · b + c`, fused exactly when [`Lanes::scalar_fma`] is.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a · b`.
    ///
    /// # Safety
    /// `Self`'s instruction set must be available.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    fn scalar_fma(a: f32, b: f32, c: f32) -> f32;
}

/// Eight lanes of a [`Simd`] implementation.
#[derive(Clone, Copy)]
struct Eight<S>(std::marker::PhantomData<S>);

impl<S: Simd> Lanes for Eight<S> {
    const W: usize = 8;
    type V = S::V;
    #[inline(always)]
    unsafe fn zero() -> S::V {
        // SAFETY: `Lanes`' contract for `Eight<S>` is `S`'s instruction set, all `S::zero` needs.
        unsafe { S::zero() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> S::V {
        // SAFETY: `Lanes`' contract for `Eight<S>` is `S`'s instruction set, all `S::splat` needs.
        unsafe { S::splat(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> S::V {
        // SAFETY: with `W = 8`, `Lanes::load`'s contract (8 readable f32 at `p`, `S` available) is
        // `S::load`'s.
        unsafe { S::load(p) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> S::V {
        // SAFETY: with `W = 8`, `Lanes::load_f16`'s contract (8 readable u16 at `p`, `S` available) is
        // `S::load_f16`'s.
        unsafe { S::load_f16(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: S::V) {
        // SAFETY: with `W = 8`, `Lanes::store`'s contract (8 writable f32 at `p`, `S` available) is
        // `S::store`'s.
        unsafe { S::store(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: S::V, b: S::V, c: S::V) -> S::V {
        // SAFETY: `Lanes`' contract for `Eight<S>` is `S`'s instruction set, all `S::mul_add` needs.
        unsafe { S::mul_add(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: S::V, b: S::V) -> S::V {
        // SAFETY: `Lanes`' contract for `Eight<S>` is `S`'s instruction set, all `S::mul` needs.
        unsafe { S::mul(a, b) }
    }
    #[inline(always)]
    fn scalar_fma(a: f32, b: f32, c: f32) -> f32 {
        S::scalar_mul_add(a, b, c)
    }
}

/// Sixteen AVX-512 lanes.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Sixteen;

#[cfg(target_arch = "x86_64")]
impl Lanes for Sixteen {
    const W: usize = 16;
    type V = std::arch::x86_64::__m512;
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        // SAFETY: AVX-512F is available (`Lanes`' contract for `Sixteen`).
        unsafe { std::arch::x86_64::_mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        // SAFETY: AVX-512F is available (`Lanes`' contract for `Sixteen`).
        unsafe { std::arch::x86_64::_mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: 16 f32 at `p` are readable and AVX-512F is available (`Lanes::load`'s contract);
        // `loadu` needs no alignment.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        use std::arch::x86_64::*;
        // SAFETY: 16 u16 at `p` are the 32 readable bytes the unaligned `_mm256_loadu_si256` reads
        // (`Lanes::load_f16`'s contract); `_mm512_cvtph_ps` needs AVX-512F, which the contract gives.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: 16 f32 at `p` are writable and AVX-512F is available (`Lanes::store`'s contract);
        // `storeu` needs no alignment.
        unsafe { std::arch::x86_64::_mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: AVX-512F is available (`Lanes`' contract for `Sixteen`).
        unsafe { std::arch::x86_64::_mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: AVX-512F is available (`Lanes`' contract for `Sixteen`).
        unsafe { std::arch::x86_64::_mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn scalar_fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// A cache element: `f32`, or `u16` holding the bits of an f16 (widened exactly when read).
trait KvElem: Copy + Send + Sync {
    /// `L::W` elements from `p` as f32 lanes.
    ///
    /// # Safety
    /// `p..p + L::W` must be readable (any alignment) and `L`'s instruction set available.
    unsafe fn load<L: Lanes>(p: *const Self) -> L::V;
    fn to_f32(self) -> f32;
}

impl KvElem for f32 {
    #[inline(always)]
    unsafe fn load<L: Lanes>(p: *const f32) -> L::V {
        // SAFETY: `KvElem::load`'s contract (`L::W` readable f32 at `p`, `L` available) is `L::load`'s.
        unsafe { L::load(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for u16 {
    #[inline(always)]
    unsafe fn load<L: Lanes>(p: *const u16) -> L::V {
        // SAFETY: `KvElem::load`'s contract (`L::W` readable u16 at `p`, `L` available) is
        // `L::load_f16`'s.
        unsafe { L::load_f16(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::from_bits(self).to_f32()
    }
}

/// `G` query heads of one KV head (`t.q` holds them; `out` is as long), value vectors `P` at a time.
/// `S` supplies the exponential (the same 8-lane code whatever `L`, so every ISA gives the same bits).
///
/// # Safety
/// `L`'s and `S`'s instruction sets are available; `t.q` holds exactly `G · head_dim` values; and `t`
/// is consistent with its cache, as `paged_attention` and `attend` check: `t.kv_head <
/// t.layout.num_kv_heads`, every block of `t.block_table` is below `t.layout.num_blocks`, and
/// `t.k_cache` and `t.v_cache` hold at least `t.layout.len()` elements.
#[inline(always)]
unsafe fn heads<L: Lanes, S: Simd, E: KvElem, const G: usize, const P: usize>(
    t: &Task<'_, E>,
    out: &mut [f32],
) {
    let hd = t.layout.head_dim;
    debug_assert_eq!(t.q.len(), G * hd, "query heads of the task");
    out[..G * hd].fill(0.0);
    let mut m = [f32::NEG_INFINITY; G];
    let mut l = [0.0f32; G];
    let mut scores = [[0.0f32; 2 * CHUNK]; G];
    let mut probs = [[0.0f32; CHUNK]; G];
    let n_ctx = t.pos + 1;
    let mut start = 0;
    while start < n_ctx {
        // Two chunks at a time: their scores are computed together (twice the independent chains).
        let a = t.chunk(start);
        let b = (start + a.len < n_ctx).then(|| t.chunk(start + a.len));
        let next = start + a.len + b.map_or(0, |c| c.len);
        for c in [Some(a), b].into_iter().flatten() {
            t.prefetch::<S>(c, true);
        }
        if next < n_ctx {
            t.prefetch::<S>(t.chunk(next), false);
        }
        // SAFETY: `a` and `b` come from `t.chunk`, so each lies within one block (`len ≤ bs − slot0`)
        // and has at most CHUNK keys; `L` is available and `t` consistent (our contract).
        unsafe { score_chunks::<L, E, G>(t, a, b, &mut scores) };
        for (c, at) in [(a, 0)].into_iter().chain(b.map(|c| (c, CHUNK))) {
            for g in 0..G {
                let s = &scores[g][at..at + c.len];
                let cmax = s.iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
                let m_new = m[g].max(cmax);
                // An unchanged maximum rescales by e^0 = 1 exactly: skipped, with the same result.
                if m_new != m[g] {
                    let corr = (m[g] - m_new).exp();
                    l[g] *= corr;
                    // SAFETY: `S` is available (our contract); `scale` stays within the checked
                    // slice `out[g·hd..(g + 1)·hd]`.
                    unsafe { simd::scale::<S>(corr, &mut out[g * hd..(g + 1) * hd]) };
                }
                // SAFETY: `S` is available (our contract); `exp_shifted` stays within the checked
                // slices `s` and `probs[g][..c.len]`.
                unsafe { simd::exp_shifted::<S>(s, m_new, &mut probs[g][..c.len]) };
                for &p in &probs[g][..c.len] {
                    l[g] += p;
                }
                m[g] = m_new;
            }
            // SAFETY: `c` is a chunk of `t` (from `t.chunk`), `out` holds `G · hd` values (the `fill`
            // above checked it), `L` is available and `t` consistent (our contract).
            unsafe { values::<L, E, G, P>(t, c, &probs, out) };
        }
        start = next;
    }
    for g in 0..G {
        // SAFETY: `S` is available (our contract); `scale` stays within the checked slice
        // `out[g·hd..(g + 1)·hd]`.
        unsafe { simd::scale::<S>(1.0 / l[g], &mut out[g * hd..(g + 1) * hd]) };
    }
}

/// The scores of chunk `a` (into `scores[g][..a.len]`) and `b` (into `scores[g][CHUNK..]`): lane groups
/// that lie within their block two at a time, the rest (odd block sizes only) key by key.
///
/// # Safety
/// `L`'s instruction set is available; `a` and `b` come from `t.chunk` (each within one block, at most
/// CHUNK keys); `t` meets [`heads`]' contract with `G` heads.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // the query and the scores are indexed by the same head
unsafe fn score_chunks<L: Lanes, E: KvElem, const G: usize>(
    t: &Task<'_, E>,
    a: Chunk,
    b: Option<Chunk>,
    scores: &mut [[f32; 2 * CHUNK]; G],
) {
    let (hd, bs) = (t.layout.head_dim, t.layout.block_size);
    let kc = t.k_cache.as_ptr();
    // (cache offset of the group's first key, its first score index)
    let mut groups = [(0usize, 0usize); 2 * CHUNK / 8];
    let mut n = 0;
    for (c, at) in [(a, 0)].into_iter().chain(b.map(|c| (c, CHUNK))) {
        let mut off = 0;
        while off < c.len {
            if c.slot0 + off + L::W <= bs {
                groups[n] = (c.k + off, at + off);
                n += 1;
                off += L::W;
                continue;
            }
            // The last keys of a block too small for a whole register: the same chain, one key at a time.
            for i in off..c.len {
                for g in 0..G {
                    let mut s = 0.0f32;
                    for d in 0..hd {
                        // SAFETY: within block `c`'s keys (slot `c.slot0 + i < bs`).
                        s = L::scalar_fma(t.q[g * hd + d], unsafe { *kc.add(c.k + d * bs + i) }.to_f32(), s);
                    }
                    scores[g][at + i] = s * t.scale;
                }
            }
            break;
        }
    }
    let mut i = 0;
    // SAFETY: a group was recorded only when `c.slot0 + off + W ≤ bs`, so its W keys of every dimension
    // lie in its block's key rows, inside `t.k_cache` (block id < num_blocks, our contract); its score
    // index is `at + off` with `off` a multiple of W below `c.len ≤ CHUNK` (W divides CHUNK), so
    // `at + off + W ≤ at + CHUNK ≤ 2·CHUNK`. That, `L`, and `t.q` of `G` heads are `score_groups`' terms.
    unsafe {
        while i + 2 <= n {
            score_groups::<L, E, G, 2>(t, [groups[i], groups[i + 1]], scores);
            i += 2;
        }
        if i < n {
            score_groups::<L, E, G, 1>(t, [groups[i]], scores);
        }
    }
}

/// `N` lane groups of `W` keys each against `G` query heads: `G × N` chains over the head dimension.
///
/// # Safety
/// `L`'s instruction set is available; `t.q` holds `G · head_dim` values; for every `(off, at)` in
/// `groups`, the `L::W` keys at `off + d · block_size` lie in `t.k_cache` for every `d < head_dim`,
/// and `at + L::W ≤ 2 · CHUNK`.
#[inline(always)]
unsafe fn score_groups<L: Lanes, E: KvElem, const G: usize, const N: usize>(
    t: &Task<'_, E>,
    groups: [(usize, usize); N],
    scores: &mut [[f32; 2 * CHUNK]; G],
) {
    let (hd, bs) = (t.layout.head_dim, t.layout.block_size);
    // SAFETY: by our contract: the key loads at `off + d·bs` (`d < hd`) stay in `t.k_cache`;
    // `get_unchecked(g·hd + d)` with `g < G`, `d < hd` is inside `t.q` (`G · hd` values); each store
    // writes `scores[g][at..at + W]` with `at + W ≤ 2·CHUNK`; and `L` is available.
    unsafe {
        let kc = t.k_cache.as_ptr();
        let mut acc = [[L::zero(); N]; G];
        for d in 0..hd {
            let mut k = [L::zero(); N];
            for (kv, &(off, _)) in k.iter_mut().zip(&groups) {
                // SAFETY: the group's W keys lie within one block (checked by the caller).
                *kv = E::load::<L>(kc.add(off + d * bs));
            }
            for (g, row) in acc.iter_mut().enumerate() {
                let qd = L::splat(*t.q.get_unchecked(g * hd + d));
                for (a, kv) in row.iter_mut().zip(&k) {
                    *a = L::fma(qd, *kv, *a);
                }
            }
        }
        let scale = L::splat(t.scale);
        for (g, row) in acc.iter().enumerate() {
            for (a, &(_, at)) in row.iter().zip(&groups) {
                // `at + W ≤ 2 · CHUNK`: groups start at multiples of W within a chunk of ≤ CHUNK keys.
                L::store(scores[g].as_mut_ptr().add(at), L::mul(*a, scale));
            }
        }
    }
}

/// `out[g] += Σ_i probs[g][i] · v_i` over chunk `c`'s values in order, `P` vectors of the head
/// dimension at a time (then one at a time, then a scalar tail).
///
/// # Safety
/// `L`'s instruction set is available; `c` is a chunk of `t` and `out` holds at least `G · head_dim`
/// values.
#[inline(always)]
unsafe fn values<L: Lanes, E: KvElem, const G: usize, const P: usize>(
    t: &Task<'_, E>,
    c: Chunk,
    probs: &[[f32; CHUNK]; G],
    out: &mut [f32],
) {
    let hd = t.layout.head_dim;
    let v = &t.v_cache[c.v..c.v + c.len * hd];
    let mut j = 0;
    // SAFETY: `v` is a checked slice of `c.len · hd` values; each pass covers dimensions
    // `j..j + Q·W` with `j + Q·W ≤ hd` (the loop conditions); with `out` of `G · hd` values and `L`
    // available (our contract) that is all `values_pass` requires.
    unsafe {
        while j + P * L::W <= hd {
            values_pass::<L, E, G, P>(v, hd, c.len, j, probs, out);
            j += P * L::W;
        }
        while j + L::W <= hd {
            values_pass::<L, E, G, 1>(v, hd, c.len, j, probs, out);
            j += L::W;
        }
    }
    for d in j..hd {
        for (g, pg) in probs.iter().enumerate() {
            let mut a = out[g * hd + d];
            for (i, &p) in pg[..c.len].iter().enumerate() {
                a = L::scalar_fma(p, v[i * hd + d].to_f32(), a);
            }
            out[g * hd + d] = a;
        }
    }
}

/// Dimensions `j..j + Q·W` of every head's accumulator, held in registers over the chunk's keys.
///
/// # Safety
/// `L`'s instruction set is available; `j + Q · L::W ≤ hd`, `v.len() ≥ len · hd` and
/// `out.len() ≥ G · hd`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // key `i` indexes the values and every head's probabilities
unsafe fn values_pass<L: Lanes, E: KvElem, const G: usize, const Q: usize>(
    v: &[E],
    hd: usize,
    len: usize,
    j: usize,
    probs: &[[f32; CHUNK]; G],
    out: &mut [f32],
) {
    // SAFETY: by our contract, each access to `out` covers `g·hd + j + p·W ..+ W`, which ends at most at
    // `g·hd + j + Q·W ≤ (g + 1)·hd ≤ G·hd ≤ out.len()`, and each load from `v` ends at most at
    // `i·hd + j + Q·W ≤ (i + 1)·hd ≤ len·hd ≤ v.len()` (`i < len`); loads and stores are unaligned, and
    // `L` is available.
    unsafe {
        let mut acc = [[L::zero(); Q]; G];
        for (g, row) in acc.iter_mut().enumerate() {
            for (p, a) in row.iter_mut().enumerate() {
                *a = L::load(out.as_ptr().add(g * hd + j + p * L::W));
            }
        }
        for i in 0..len {
            let mut vv = [L::zero(); Q];
            for (p, x) in vv.iter_mut().enumerate() {
                // SAFETY: `i < len` and `j + Q·W ≤ hd`: within the chunk's values.
                *x = E::load::<L>(v.as_ptr().add(i * hd + j + p * L::W));
            }
            for (g, row) in acc.iter_mut().enumerate() {
                let pg = L::splat(probs[g][i]);
                for (a, x) in row.iter_mut().zip(&vv) {
                    *a = L::fma(pg, *x, *a);
                }
            }
        }
        for (g, row) in acc.iter().enumerate() {
            for (p, a) in row.iter().enumerate() {
                L::store(out.as_mut_ptr().add(g * hd + j + p * L::W), *a);
            }
        }
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
