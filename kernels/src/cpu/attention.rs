//! Paged causal attention on the CPU: each walk (`attention_plan.rs`: consecutive rows of one
//! sequence × the query heads of one KV head) goes through its sequence's blocks in position order with
//! an online (running-max) softmax for every query vector it carries, never materialising the
//! attention matrix.
//!
//! Invariants: the query at position `p` attends to positions `0..=p` of its own sequence only (under a
//! sliding window of `w`, to `p + 1 − w..=p`: the walk starts at the chunk holding the window's first
//! position and masks the positions before it, and rows then share no walk); the
//! walk is in position order in chunks of at most [`CHUNK`] positions that never straddle a block, so
//! the arithmetic for one (row, head) depends only on that row's query and the cached K/V — not on the
//! batch, the other rows of a prefill chunk, the walk it shares, or thread scheduling. A token's output
//! is therefore the same whether it was computed in a prefill chunk, a verification chunk or as a
//! decode step. Every quantity is a per-element chain in a fixed order, so 8-lane (AVX2), 16-lane
//! (AVX-512) and scalar code give the same bits:
//! - a score is `s = fma(q[d], k[d], s)` for `d = 0..head_dim` in order from 0, then `s · scale`; the
//!   keys are stored transposed within a block ([`KvLayout::key_offset`]), so a vector register holds one
//!   dimension of consecutive keys and scores W keys at once, with no horizontal sums;
//! - per chunk: `m' = max(m, scores)`, `l = l · e^(m − m') + Σ p` (the `p = e^(s − m')` added in order),
//!   `acc = acc · e^(m − m')`, then `acc[d] = fma(p_i, v_i[d], acc[d])` for the chunk's keys in order;
//! - finally `out = acc · (1 / l)`.
//!
//! An 8-bit cache ([`KvDType::Q8_0`]) holds integers `k[d]`, `v[d]` and a scale per cached vector: a
//! score is then `(s · scale) · k_scale` (the chain over the integers unchanged), and the value pass
//! uses `p_i · v_scale_i` after `l` took `p_i`, so the integers are only widened, never rescaled in
//! the cache, and the lanes still agree bit for bit.
//!
//! Several rows of one sequence share a walk up to the last chunk boundary their contexts have in
//! common (every chunk before it is the same whole chunk for each of them), then each row finishes its
//! own last chunks alone: so each cached key and value is loaded and widened once per walk, not once
//! per row, and a verification step of 1 + k rows costs far less than 1 + k decode steps.
//!
//! Design: the CPU analogue of FlashAttention's / vLLM PagedAttention's inner loop (Dao et al. 2022;
//! Kwon et al. 2023; vLLM also keeps keys and values in different layouts). The query vectors of a
//! walk run together, so each cached key and value is loaded once for all of them, and when they are
//! few two chunks' scores are computed together for more independent chains.

use super::matmul::OutPtr;
use super::pool;
use super::simd::{self, Isa, Portable, Simd};
use crate::layout::{AttnHeads, AttnSeq, KvDType, KvLayout};
#[cfg(target_arch = "x86_64")]
use lanes::Sixteen;
use lanes::{Eight, KvElem, Lanes};
use plan::{MAX_VECTORS, Walk};

#[path = "attention_lanes.rs"]
mod lanes;
#[path = "attention_plan.rs"]
mod plan;

/// Positions scored at a time (one online-softmax update).
const CHUNK: usize = 32;

/// What one walk needs; `E` is the cache's element (`f32`, or `u16` holding f16 bits).
struct Task<'a, E> {
    /// The walk's query vectors (rows × heads of one KV head), one after another.
    q: &'a [f32],
    block_table: &'a [u32],
    pos: usize,
    kv_head: usize,
    layout: &'a KvLayout,
    k_cache: &'a [E],
    v_cache: &'a [E],
    /// An 8-bit cache's key and value scales (f16 bits, [`KvLayout::scale_offset`]); empty otherwise.
    k_scales: &'a [u16],
    v_scales: &'a [u16],
    scale: f32,
    /// The first position this row sees (0, or the start of its sliding window); positions before it
    /// in the walk's first chunk are masked.
    lo: usize,
    /// Sliding window (`AttnHeads::window`).
    window: Option<usize>,
}

/// A piece of the walk: `len` positions from slot `slot0` of one block, with the cache offsets of its
/// first key (transposed layout) and first value, and the index of its first scale (8-bit caches).
#[derive(Clone, Copy)]
struct Chunk {
    len: usize,
    slot0: usize,
    k: usize,
    v: usize,
    s: usize,
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
            s: self.layout.scale_offset(block, self.kv_head, slot0),
        }
    }

    /// Asks for the keys of `c` (one line per dimension and 16 positions) and, with `values`, its
    /// values: the walk jumps from block to block of the paged cache, which the hardware prefetchers
    /// only pick up a few lines into each block.
    #[inline(always)]
    fn prefetch<S: Simd>(&self, c: Chunk, values: bool) {
        // One hint per cache line: the chunk's keys (its slots of every dimension row, the rows in
        // between too) and its values are each one range of the cache.
        let step = (64 / std::mem::size_of::<E>()).max(1);
        let lines = |base: *const E, len: usize| {
            for off in (0..len).step_by(step).chain(std::iter::once(len - 1)) {
                S::prefetch(base.wrapping_add(off).cast());
            }
        };
        let (hd, bs) = (self.layout.head_dim, self.layout.block_size);
        lines(self.k_cache.as_ptr().wrapping_add(c.k), (hd - 1) * bs + c.len);
        if values {
            lines(self.v_cache.as_ptr().wrapping_add(c.v), c.len * hd);
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
        KvDType::F32 => attend(isa, q, seqs, heads, layout, Cache::plain(k_cache, v_cache), out),
        KvDType::F16 => {
            let (k, v) = (bytemuck::cast_slice(k_cache), bytemuck::cast_slice(v_cache));
            attend::<u16>(isa, q, seqs, heads, layout, Cache::plain(k, v), out)
        }
        KvDType::Q8_0 => {
            let ((k, k_scales), (v, v_scales)) = (
                super::kv_q8::parts(layout, k_cache),
                super::kv_q8::parts(layout, v_cache),
            );
            attend::<i8>(
                isa,
                q,
                seqs,
                heads,
                layout,
                Cache {
                    k,
                    v,
                    k_scales,
                    v_scales,
                },
                out,
            )
        }
    }
}

/// One layer's K and V cache as `E` elements, and an 8-bit cache's scales (empty otherwise).
struct Cache<'a, E> {
    k: &'a [E],
    v: &'a [E],
    k_scales: &'a [u16],
    v_scales: &'a [u16],
}

impl<'a, E> Cache<'a, E> {
    /// A cache whose elements carry no scales (f32, f16).
    fn plain(k: &'a [E], v: &'a [E]) -> Self {
        Self {
            k,
            v,
            k_scales: &[],
            v_scales: &[],
        }
    }
}

/// [`paged_attention`] on a cache of `E` elements.
fn attend<E: KvElem>(
    isa: Isa,
    q: &[f32],
    seqs: &[AttnSeq<'_>],
    heads: AttnHeads,
    layout: &KvLayout,
    cache: Cache<'_, E>,
    out: &mut [f32],
) {
    assert!(
        !E::SCALED
            || (cache.k_scales.len() >= layout.num_vectors() && cache.v_scales.len() >= layout.num_vectors()),
        "scales shorter than the cache"
    );
    let hd = heads.head_dim;
    let group = heads.num_heads / heads.num_kv_heads;
    let width = heads.num_heads * hd;
    let rows: usize = seqs.iter().map(|s| s.row_start + s.num_rows).max().unwrap_or(0);
    // Rows no sequence claims get zeros.
    let mut claimed = vec![false; rows];
    for s in seqs {
        assert!(
            s.block_table.len() * layout.block_size >= s.first_pos + s.num_rows,
            "block table too short"
        );
        // Under a window, entries before the first row's window are never read (a KV cache may have
        // given their blocks back).
        let seen = heads.window.map_or(0, |w| {
            (s.first_pos + 1).saturating_sub(w.max(1)) / layout.block_size
        });
        assert!(
            s.block_table[seen.min(s.block_table.len())..]
                .iter()
                .all(|&b| (b as usize) < layout.num_blocks),
            "block outside the cache"
        );
        claimed[s.row_start..s.row_start + s.num_rows].fill(true);
    }
    assert!(
        q.len() >= rows * width && out.len() >= rows * width,
        "attention buffers too short"
    );
    for (r, _) in claimed.iter().enumerate().filter(|(_, c)| !**c) {
        out[r * width..(r + 1) * width].fill(0.0);
    }
    let per_seq: Vec<usize> = seqs.iter().map(|s| s.num_rows).collect();
    let walks = plan::plan(&per_seq, heads.num_kv_heads, group, pool::threads());
    let out_ptr = OutPtr(out.as_mut_ptr());
    pool::for_each(walks.len(), |i| {
        let w = walks[i];
        let s = &seqs[w.seq];
        let task = Task {
            q: &[],
            block_table: s.block_table,
            pos: s.first_pos + w.row,
            kv_head: w.kv_head,
            layout,
            k_cache: cache.k,
            v_cache: cache.v,
            k_scales: cache.k_scales,
            v_scales: cache.v_scales,
            scale: heads.scale,
            lo: 0,
            window: heads.window,
        };
        // Where vector (r, h) of the walk lives in `q` and `out`.
        let at =
            |r: usize, h: usize| (s.row_start + w.row + r) * width + (w.kv_head * group + w.head + h) * hd;
        // SAFETY: the ISA was detected on this CPU; the cache offsets were checked above (block ids,
        // layout length); `at` stays below `rows · width` (`q` and `out` hold that many, checked above),
        // and the walks write disjoint (row, head) vectors of `out` (`plan`'s invariant), which nothing
        // else reads during the loop.
        unsafe { walk_rows(isa, &task, w, q, at, out_ptr) };
    });
}

/// Runs walk `w` (its task's `pos` is its first row's position): the rows' query vectors gathered,
/// their common chunks walked together, each row's own last chunks alone, the results scattered.
///
/// # Safety
/// As for [`run`]; `at(r, h)` is the offset of vector (r, h) in `q` and in `out`, whose `head_dim`
/// values there belong to this walk alone.
unsafe fn walk_rows<E: KvElem>(
    isa: Isa,
    t: &Task<'_, E>,
    w: Walk,
    q: &[f32],
    at: impl Fn(usize, usize) -> usize,
    out: OutPtr,
) {
    let hd = t.layout.head_dim;
    let v = w.vectors();
    let mut qs = vec![0.0f32; v * hd];
    for r in 0..w.rows {
        for h in 0..w.heads {
            qs[(r * w.heads + h) * hd..][..hd].copy_from_slice(&q[at(r, h)..at(r, h) + hd]);
        }
    }
    let mut acc = vec![0.0f32; v * hd];
    let (mut m, mut l) = ([f32::NEG_INFINITY; MAX_VECTORS], [0.0f32; MAX_VECTORS]);
    // The last whole-chunk boundary at or before the first row's end: every row's walk passes it.
    let (bs, n_ctx) = (t.layout.block_size, t.pos + 1);
    let mut joint = 0;
    while joint < n_ctx {
        let next = joint + (bs - joint % bs).min(CHUNK);
        if next > n_ctx {
            break;
        }
        joint = next;
    }
    // Under a sliding window each row starts at its own window, so rows share no walk.
    if w.rows > 1 && joint > 0 && t.window.is_none() {
        let shared = Task {
            q: &qs,
            pos: joint - 1,
            ..*t
        };
        // SAFETY: our contract; `qs` holds the walk's `v` vectors and `acc`, `m`, `l` as many.
        unsafe { run(isa, v, &shared, 0, (&mut m[..v], &mut l[..v]), &mut acc, false) };
    } else {
        joint = 0;
    }
    for r in 0..w.rows {
        let (lo, hi) = (r * w.heads, (r + 1) * w.heads);
        let pos = t.pos + r;
        let row_lo = t.window.map_or(0, |win| (pos + 1).saturating_sub(win.max(1)));
        let row = Task {
            q: &qs[lo * hd..hi * hd],
            pos,
            lo: row_lo,
            ..*t
        };
        let from = if row_lo > 0 {
            chunk_start(bs, row_lo)
        } else {
            joint
        };
        // SAFETY: our contract; row `r`'s `heads` vectors and their state.
        unsafe {
            run(
                isa,
                w.heads,
                &row,
                from,
                (&mut m[lo..hi], &mut l[lo..hi]),
                &mut acc[lo * hd..hi * hd],
                true,
            )
        };
        for h in 0..w.heads {
            let src = &acc[(lo + h) * hd..(lo + h + 1) * hd];
            // SAFETY: `at(r, h) .. + hd` is this walk's part of `out` (our contract).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.at(at(r, h)), hd) };
        }
    }
}

/// The start of the walk's chunk that holds position `p`: chunks are cut from each block's start, at
/// most [`CHUNK`] positions long (as [`Task::chunk`] cuts them), so this is a whole-chunk boundary.
fn chunk_start(bs: usize, p: usize) -> usize {
    let mut start = p - p % bs;
    while start + (bs - start % bs).min(CHUNK) <= p {
        start += (bs - start % bs).min(CHUNK);
    }
    start
}

/// Walks `n ≤ MAX_VECTORS` query vectors (`t.q`) over positions `from..=t.pos` with the widest lanes
/// of `isa`, continuing the running maxima and sums `state` and the accumulators `out` (`n · head_dim`
/// values); with `finish`, divides the accumulators by the sums at the end.
///
/// # Safety
/// This CPU has `isa`'s extensions (`Isa`'s invariant); `t.q` holds exactly `n` vectors; `state`'s
/// slices hold `n` values; `from` is 0 or a whole-chunk boundary of `t`'s walk (see [`Task::chunk`]);
/// `t` meets the rest of [`walk`]'s contract.
unsafe fn run<E: KvElem>(
    isa: Isa,
    n: usize,
    t: &Task<'_, E>,
    from: usize,
    state: (&mut [f32], &mut [f32]),
    out: &mut [f32],
    finish: bool,
) {
    let s = State { from, state, finish };
    macro_rules! by_vectors {
        ($f:ident) => {
            match n {
                1 => $f::<E, 1>(t, s, out),
                2 => $f::<E, 2>(t, s, out),
                3 => $f::<E, 3>(t, s, out),
                4 => $f::<E, 4>(t, s, out),
                5 => $f::<E, 5>(t, s, out),
                6 => $f::<E, 6>(t, s, out),
                7 => $f::<E, 7>(t, s, out),
                8 => $f::<E, 8>(t, s, out),
                9 => $f::<E, 9>(t, s, out),
                10 => $f::<E, 10>(t, s, out),
                11 => $f::<E, 11>(t, s, out),
                12 => $f::<E, 12>(t, s, out),
                13 => $f::<E, 13>(t, s, out),
                14 => $f::<E, 14>(t, s, out),
                15 => $f::<E, 15>(t, s, out),
                _ => $f::<E, 16>(t, s, out),
            }
        };
    }
    // SAFETY: `Isa::Avx512` / `Isa::Avx2` are only held where their extensions were found (our
    // contract), which covers what `run_avx512` / `run_avx2` enable; `by_vectors!` picks `G = n` for
    // `n` in 1..=MAX_VECTORS, so `t.q` holds the `G` vectors `walk` expects, and its other terms are ours.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => by_vectors!(run_avx512),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => by_vectors!(run_avx2),
            _ => by_vectors!(run_portable),
        }
    }
}

/// Where a walk starts and what it continues (see [`run`]).
struct State<'a> {
    from: usize,
    state: (&'a mut [f32], &'a mut [f32]),
    finish: bool,
}

/// # Safety
/// As for [`walk`] (no CPU extension needed).
unsafe fn run_portable<E: KvElem, const G: usize>(t: &Task<'_, E>, s: State<'_>, out: &mut [f32]) {
    // SAFETY: the portable lanes need no CPU extension; the rest of `walk`'s contract is ours.
    unsafe { walk::<Eight<Portable>, Portable, E, G, 2>(t, s, out) }
}

/// # Safety
/// AVX2, FMA and F16C must be available; otherwise as for [`walk`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<E: KvElem, const G: usize>(t: &Task<'_, E>, s: State<'_>, out: &mut [f32]) {
    // SAFETY: `Eight<Avx2>` and `Avx2`'s exponential need AVX2/FMA/F16C, which this function enables
    // and our caller guarantees (`# Safety`); the rest of `walk`'s contract is ours.
    unsafe { walk::<Eight<simd::Avx2>, simd::Avx2, E, G, 2>(t, s, out) }
}

/// # Safety
/// AVX-512F/VL, AVX2, FMA and F16C must be available; otherwise as for [`walk`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn run_avx512<E: KvElem, const G: usize>(t: &Task<'_, E>, s: State<'_>, out: &mut [f32]) {
    // SAFETY: `Sixteen` needs AVX-512F and `Avx2`'s exponential AVX2/FMA/F16C, all enabled here and
    // guaranteed by our caller (`# Safety`); the rest of `walk`'s contract is ours.
    unsafe { walk::<Sixteen, simd::Avx2, E, G, 4>(t, s, out) }
}

/// `G` query vectors (`t.q` holds them; `out` is as long) over positions `s.from..=t.pos`, value
/// vectors `P` at a time (fewer when many query vectors share the registers). `S` supplies the
/// exponential (the same 8-lane code whatever `L`, so every ISA gives the same bits).
///
/// # Safety
/// `L`'s and `S`'s instruction sets are available; `t.q` holds exactly `G · head_dim` values and
/// `s.state`'s slices `G` values; `s.from` is 0 or a whole-chunk boundary at or before `t.pos + 1`; and
/// `t` is consistent with its cache, as `paged_attention` and `attend` check: `t.kv_head <
/// t.layout.num_kv_heads`, every block of `t.block_table` is below `t.layout.num_blocks`, and
/// `t.k_cache` and `t.v_cache` hold at least `t.layout.len()` elements.
#[inline(always)]
unsafe fn walk<L: Lanes, S: Simd, E: KvElem, const G: usize, const P: usize>(
    t: &Task<'_, E>,
    s: State<'_>,
    out: &mut [f32],
) {
    let hd = t.layout.head_dim;
    debug_assert_eq!(t.q.len(), G * hd, "query vectors of the walk");
    let (m_io, l_io) = s.state;
    let mut m: [f32; G] = std::array::from_fn(|g| m_io[g]);
    let mut l: [f32; G] = std::array::from_fn(|g| l_io[g]);
    let out = &mut out[..G * hd];
    let mut scores = [[0.0f32; 2 * CHUNK]; G];
    let mut probs = [[0.0f32; CHUNK]; G];
    let n_ctx = t.pos + 1;
    let mut start = s.from;
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
        if start < t.lo {
            // The window's first chunk: positions before it get no weight (e^−∞ = 0).
            for (first, at, len) in [(start, 0, a.len)]
                .into_iter()
                .chain(b.map(|c| (start + a.len, CHUNK, c.len)))
            {
                let masked = t.lo.saturating_sub(first).min(len);
                scores
                    .iter_mut()
                    .for_each(|s| s[at..at + masked].fill(f32::NEG_INFINITY));
            }
        }
        for (c, at) in [(a, 0)].into_iter().chain(b.map(|c| (c, CHUNK))) {
            // SAFETY: `S` is available (our contract); `at + c.len ≤ 2 · CHUNK` and `c.len ≤ CHUNK`;
            // `out` holds `G` vectors of `hd`.
            unsafe { softmax_step::<L, S, G>(&scores, at, c.len, (&mut m, &mut l), out, &mut probs) };
            if E::SCALED {
                // An 8-bit value is `q · scale`: the scale goes on its weight (after the sum `l`
                // took the weight), so the values are only widened.
                let vs = &t.v_scales[c.s..c.s + c.len];
                for p in probs.iter_mut() {
                    for (x, &s) in p.iter_mut().zip(vs) {
                        *x *= half::f16::from_bits(s).to_f32();
                    }
                }
            }
            // SAFETY: `c` is a chunk of `t` (from `t.chunk`), `out` holds `G · hd` values, `L` is
            // available and `t` consistent (our contract).
            unsafe { values::<L, E, G, P>(t, c, &probs, out) };
        }
        start = next;
    }
    if s.finish {
        for g in 0..G {
            // SAFETY: `S` is available (our contract); `scale` stays within `out`'s `g`-th vector.
            unsafe { simd::scale::<S>(1.0 / l[g], &mut out[g * hd..(g + 1) * hd]) };
        }
    }
    m_io[..G].copy_from_slice(&m);
    l_io[..G].copy_from_slice(&l);
}

/// One chunk's online-softmax update of every query vector `g`: its scores `scores[g][at..at + len]`
/// raise its running maximum `m[g]` (its accumulators in `out` and its sum `l[g]` rescaled by
/// `e^(m − m')` when it moves), and `probs[g][..len]` gets `e^(s − m')` ([`Lanes::exp`], whole
/// registers: the lanes past `len` are computed and never read), added to `l[g]` in order.
/// The vectors' maxima and sums are folded side by side (each still in key order), so their chains
/// overlap instead of waiting on one another.
///
/// # Safety
/// `L`'s and `S`'s instruction sets are available; `at + len ≤ 2 · CHUNK`, `len ≤ CHUNK`, `at` a
/// multiple of `L::W`; `out` holds `G` vectors.
#[inline(always)]
unsafe fn softmax_step<L: Lanes, S: Simd, const G: usize>(
    scores: &[[f32; 2 * CHUNK]; G],
    at: usize,
    len: usize,
    (m, l): (&mut [f32; G], &mut [f32; G]),
    out: &mut [f32],
    probs: &mut [[f32; CHUNK]; G],
) {
    let hd = out.len() / G;
    let mut cmax = [f32::NEG_INFINITY; G];
    for i in at..at + len {
        for (c, s) in cmax.iter_mut().zip(scores) {
            *c = c.max(s[i]);
        }
    }
    for g in 0..G {
        let m_new = m[g].max(cmax[g]);
        // An unchanged maximum rescales by e^0 = 1 exactly: skipped, with the same result.
        if m_new != m[g] {
            let corr = (m[g] - m_new).exp();
            l[g] *= corr;
            // SAFETY: `S` is available (our contract); the slice is `out`'s `g`-th vector.
            unsafe { simd::scale::<S>(corr, &mut out[g * hd..(g + 1) * hd]) };
        }
        m[g] = m_new;
        for i in (0..len).step_by(L::W) {
            // SAFETY: `L` is available (our contract); `at + i + W ≤ at + CHUNK ≤ 2 · CHUNK` and
            // `i + W ≤ CHUNK` (`i < len ≤ CHUNK`, both multiples of W, which divides CHUNK).
            unsafe {
                let shift = L::splat(m_new);
                let x = L::load(scores[g].as_ptr().add(at + i));
                L::store(probs[g].as_mut_ptr().add(i), L::exp(L::sub(x, shift)));
            }
        }
    }
    for i in 0..len {
        for (l, p) in l.iter_mut().zip(probs.iter()) {
            *l += p[i];
        }
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
    // (cache offset of the group's first key, its first score index, its first key's scale index)
    let mut groups = [(0usize, 0usize, 0usize); 2 * CHUNK / 8];
    let mut n = 0;
    for (c, at) in [(a, 0)].into_iter().chain(b.map(|c| (c, CHUNK))) {
        let mut off = 0;
        while off < c.len {
            if c.slot0 + off + L::W <= bs {
                groups[n] = (c.k + off, at + off, c.s + off);
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
                    scores[g][at + i] = if E::SCALED {
                        s * t.scale * half::f16::from_bits(t.k_scales[c.s + i]).to_f32()
                    } else {
                        s * t.scale
                    };
                }
            }
            break;
        }
    }
    let mut i = 0;
    // SAFETY: a group was recorded only when `c.slot0 + off + W ≤ bs`, so its W keys of every dimension
    // lie in its block's key rows, inside `t.k_cache` (block id < num_blocks, our contract), and its W
    // scales among its block's (`attend` checked the scales cover every block); its score
    // index is `at + off` with `off` a multiple of W below `c.len ≤ CHUNK` (W divides CHUNK), so
    // `at + off + W ≤ at + CHUNK ≤ 2·CHUNK`. That, `L`, and `t.q` of `G` heads are `score_groups`' terms.
    unsafe {
        // Pairs while few vectors leave registers for twice the accumulators.
        while G <= 8 && i + 2 <= n {
            score_groups::<L, E, G, 2>(t, [groups[i], groups[i + 1]], scores);
            i += 2;
        }
        while G > 8 && i + 1 < n {
            score_groups::<L, E, G, 1>(t, [groups[i]], scores);
            i += 1;
        }
        if i < n {
            score_groups::<L, E, G, 1>(t, [groups[i]], scores);
        }
    }
}

/// `N` lane groups of `W` keys each against `G` query heads: `G × N` chains over the head dimension.
///
/// # Safety
/// `L`'s instruction set is available; `t.q` holds `G · head_dim` values; for every `(off, at, si)` in
/// `groups`, the `L::W` keys at `off + d · block_size` lie in `t.k_cache` for every `d < head_dim`,
/// `at + L::W ≤ 2 · CHUNK`, and (8-bit caches) the `L::W` scales at `si` lie in `t.k_scales`.
#[inline(always)]
unsafe fn score_groups<L: Lanes, E: KvElem, const G: usize, const N: usize>(
    t: &Task<'_, E>,
    groups: [(usize, usize, usize); N],
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
            for (kv, &(off, _, _)) in k.iter_mut().zip(&groups) {
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
        // An 8-bit key is `q · scale`: its scale goes on the score (the W keys' scales are contiguous,
        // in `t.k_scales` at `si..si + W`, within the block as the keys are).
        let key_scales: [L::V; N] = std::array::from_fn(|i| {
            if E::SCALED {
                L::load_f16(t.k_scales.as_ptr().add(groups[i].2))
            } else {
                L::zero()
            }
        });
        for (g, row) in acc.iter().enumerate() {
            for (i, (a, &(_, at, _))) in row.iter().zip(&groups).enumerate() {
                // `at + W ≤ 2 · CHUNK`: groups start at multiples of W within a chunk of ≤ CHUNK keys.
                let s = L::mul(*a, scale);
                let s = if E::SCALED { L::mul(s, key_scales[i]) } else { s };
                L::store(scores[g].as_mut_ptr().add(at), s);
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
        // `P` vectors of dimensions at a time while `G · P` accumulators fit the registers, else 2.
        while G * P <= 16 && j + P * L::W <= hd {
            values_pass::<L, E, G, P>(v, hd, c.len, j, probs, out);
            j += P * L::W;
        }
        while G * P > 16 && G <= 8 && j + 2 * L::W <= hd {
            values_pass::<L, E, G, 2>(v, hd, c.len, j, probs, out);
            j += 2 * L::W;
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
