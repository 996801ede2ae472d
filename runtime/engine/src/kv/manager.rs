//! Request level of the KV cache: each request's block tables (one per KV-cache group, [`KvGroups`]),
//! grown as the scheduler grants it tokens and released when it finishes or is preempted (vLLM v1's
//! `KVCacheManager`: `get_computed_blocks`, `allocate_slots`, `cache_blocks`, `free`).
//!
//! Invariants:
//! - after an allocation succeeds, every table of `req` covers every token the scheduler granted; on
//!   failure no block was taken (blocks that had left a window may have been given back: nothing
//!   reads them again), so the scheduler can preempt and retry;
//! - KV is allocated as tokens are granted, never reserved ahead: a table holds
//!   `ceil(granted tokens / block_size)` entries, so at most one block per table is partly empty;
//! - in a sliding-window group, entries before the first block the request's next query sees are
//!   [`NULL_BLOCK`]: their blocks went back to the pool (cached, when registered) as the request
//!   moved on;
//! - with a [`PrefixCachingPool`], only blocks whose tokens have all been computed are registered
//!   (by their hash chain, which includes the tenant scope; group `g`'s under
//!   [`BlockHash::for_group`]), and a request's blocks are freed tail first, so under pressure the
//!   shared beginning of a prompt is the last thing evicted.

use super::block_pool::{BlockId, BlockPool, FreeListPool};
use super::groups::{KvGroups, NULL_BLOCK, first_visible_block};
use super::hash::BlockHash;
use super::prefix_pool::PrefixCachingPool;
use crate::error::{EngineError, Result};
use std::collections::HashMap;

/// The scheduler's id for a request.
pub type RequestId = u64;

/// One request's blocks.
#[derive(Default)]
struct Tables {
    /// Per group, its block table.
    groups: Vec<Vec<BlockId>>,
    /// Leading entries already registered in the prefix cache (or found there), in every group.
    num_registered: usize,
}

/// What the prefix cache holds of a request's leading blocks, per group ([`KvCacheManager::cached_prefix`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    /// Leading blocks (of `block_size` tokens) found.
    pub blocks: usize,
    /// Per group, its table for them: a window group's entries its first query no longer sees are
    /// [`NULL_BLOCK`].
    pub tables: Vec<Vec<BlockId>>,
}

impl CachedPrefix {
    /// Tokens found.
    pub fn tokens(&self, block_size: usize) -> usize {
        self.blocks * block_size
    }
}

/// Block tables of the running requests over one pool.
pub struct KvCacheManager<P: BlockPool = FreeListPool> {
    pool: P,
    block_size: usize,
    groups: KvGroups,
    tables: HashMap<RequestId, Tables>,
}

impl<P: BlockPool> KvCacheManager<P> {
    /// A manager over `pool` with blocks of `block_size` tokens and one group of full-attention layers.
    pub fn new(pool: P, block_size: usize) -> Self {
        Self::with_groups(pool, block_size, &KvGroups::uniform(1))
    }

    /// A manager over `pool` for a model with `groups`.
    pub fn with_groups(pool: P, block_size: usize, groups: &KvGroups) -> Self {
        Self {
            pool,
            block_size,
            groups: groups.clone(),
            tables: HashMap::new(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The KV-cache groups: one block table each per request.
    pub fn groups(&self) -> &KvGroups {
        &self.groups
    }

    /// The longest request (tokens) the whole pool holds, computed in steps of at most `step` tokens.
    pub fn capacity_tokens(&self, step: usize) -> usize {
        self.groups
            .tokens_fitting(self.pool.num_blocks(), step, self.block_size)
    }

    /// Makes `req`'s tables cover `num_computed + num_new` tokens, allocating blocks as needed; in a
    /// window group, first gives back the blocks the query at `num_computed` no longer sees.
    pub fn allocate_slots(
        &mut self,
        req: RequestId,
        num_computed: usize,
        num_new: usize,
    ) -> Result<&[Vec<BlockId>]> {
        let bs = self.block_size;
        let groups = self.groups.len();
        let t = self.tables.entry(req).or_default();
        t.groups.resize_with(groups, Vec::new);
        for (table, w) in t.groups.iter_mut().zip(self.groups.windows()) {
            if let Some(w) = w {
                release_before(&mut self.pool, table, first_visible_block(num_computed, *w, bs));
            }
        }
        let needed_total = (num_computed + num_new).div_ceil(bs);
        let needed: usize = t
            .groups
            .iter()
            .map(|g| needed_total.saturating_sub(g.len()))
            .sum();
        if needed > 0 {
            let free = self.pool.num_free();
            let Some(blocks) = self.pool.allocate(needed) else {
                if t.groups.iter().all(Vec::is_empty) {
                    self.tables.remove(&req); // a request that never held a block holds no table
                }
                return Err(EngineError::OutOfBlocks { needed, free });
            };
            let mut blocks = blocks.into_iter();
            for table in &mut t.groups {
                let more = needed_total.saturating_sub(table.len());
                table.extend(blocks.by_ref().take(more));
            }
        }
        Ok(&self.tables[&req].groups)
    }

    /// `req`'s tables, one per group (empty if it has none).
    pub fn block_tables(&self, req: RequestId) -> &[Vec<BlockId>] {
        self.tables.get(&req).map_or(&[], |t| t.groups.as_slice())
    }

    /// `req`'s table of group 0 (a single-group model's only table; empty if it has none).
    pub fn block_table(&self, req: RequestId) -> &[BlockId] {
        self.block_tables(req).first().map_or(&[], Vec::as_slice)
    }

    /// Releases every block of `req`, last position first (across groups).
    pub fn free(&mut self, req: RequestId) {
        if let Some(t) = self.tables.remove(&req) {
            let len = t.groups.iter().map(Vec::len).max().unwrap_or(0);
            let tail_first: Vec<BlockId> = (0..len)
                .rev()
                .flat_map(|i| t.groups.iter().filter_map(move |g| g.get(i).copied()))
                .filter(|&b| b != NULL_BLOCK)
                .collect();
            self.pool.free(&tail_first);
        }
    }

    /// Shrinks `req`'s tables to cover its first `num_tokens` tokens, freeing the blocks past them, last
    /// first (speculative decoding's rollback: positions of rejected drafts give their slots back; a
    /// partly filled last block is kept and its stale slots are overwritten when those positions are
    /// computed again). Registered blocks are never released this way: they hold computed tokens, and
    /// callers truncate only past the computed ones.
    pub fn truncate(&mut self, req: RequestId, num_tokens: usize) {
        let keep = num_tokens.div_ceil(self.block_size);
        let Some(t) = self.tables.get_mut(&req) else {
            return;
        };
        debug_assert!(
            t.groups.iter().all(|g| g.len() <= keep) || t.num_registered <= keep,
            "request {req}: truncating registered blocks"
        );
        for table in &mut t.groups {
            if table.len() > keep {
                let mut tail = table.split_off(keep);
                tail.reverse();
                tail.retain(|&b| b != NULL_BLOCK);
                self.pool.free(&tail);
            }
        }
        t.num_registered = t.num_registered.min(keep);
    }

    /// Requests holding tables.
    pub fn num_tables(&self) -> usize {
        self.tables.len()
    }

    /// Blocks held in all tables, counting a shared block once per table.
    pub fn num_table_blocks(&self) -> usize {
        let held = |g: &Vec<BlockId>| g.iter().filter(|&&b| b != NULL_BLOCK).count();
        self.tables.values().flat_map(|t| &t.groups).map(held).sum()
    }

    /// Fraction of blocks held by requests (0–1); cached blocks nobody holds count as free.
    pub fn usage(&self) -> f32 {
        let total = self.pool.num_blocks().max(1);
        (total - self.pool.num_free()) as f32 / total as f32
    }

    /// The pool (for its counts).
    pub fn pool(&self) -> &P {
        &self.pool
    }
}

/// Gives back `table`'s blocks before entry `first` (a window group's blocks no query sees).
fn release_before<P: BlockPool>(pool: &mut P, table: &mut [BlockId], first: usize) {
    let first = first.min(table.len());
    let mut gone: Vec<BlockId> = Vec::new();
    for b in table[..first].iter_mut().rev() {
        if *b == NULL_BLOCK {
            break; // everything before was given back earlier
        }
        gone.push(std::mem::replace(b, NULL_BLOCK));
    }
    // Latest first: the older block of a prompt goes back to the pool last, as `free` does.
    pool.free(&gone);
}

impl KvCacheManager<PrefixCachingPool> {
    /// The longest run of leading blocks of a request whose full-block hashes are `hashes` (at most
    /// `max_blocks` of them) that the cache holds now (in use by others or cached), in every group: a
    /// full-attention group needs each leading block, a window group only those its first new query
    /// sees. No reference is taken.
    pub fn cached_prefix(&self, hashes: &[BlockHash], max_blocks: usize) -> CachedPrefix {
        let bs = self.block_size;
        let find = |g: usize, i: usize| self.pool.lookup(&hashes[i].for_group(g));
        let mut hit = hashes.len().min(max_blocks);
        for (g, w) in self.groups.windows().iter().enumerate() {
            if w.is_none() {
                hit = (0..hit).find(|&i| find(g, i).is_none()).unwrap_or(hit);
            }
        }
        // A window group must hold the window before the first new position: the longest hit that
        // every window group can serve.
        let serves = |k: usize| {
            self.groups.windows().iter().enumerate().all(|(g, w)| match w {
                None => true,
                Some(w) => (first_visible_block(k * bs, *w, bs)..k).all(|i| find(g, i).is_some()),
            })
        };
        let blocks = (0..=hit).rev().find(|&k| serves(k)).unwrap_or(0);
        let tables = self
            .groups
            .windows()
            .iter()
            .enumerate()
            .map(|(g, w)| {
                let from = w.map_or(0, |w| first_visible_block(blocks * bs, w, bs));
                (0..blocks)
                    .map(|i| match i < from {
                        true => NULL_BLOCK,
                        false => find(g, i).expect("checked above"),
                    })
                    .collect()
            })
            .collect();
        CachedPrefix { blocks, tables }
    }

    /// Starts `req`'s tables with the cached blocks `prefix` (from [`Self::cached_prefix`], just now)
    /// and grows them to cover `num_new` more tokens. All or nothing: on failure no reference was taken.
    pub fn allocate_with_prefix(
        &mut self,
        req: RequestId,
        prefix: &CachedPrefix,
        num_new: usize,
    ) -> Result<&[Vec<BlockId>]> {
        debug_assert!(
            self.block_tables(req).is_empty(),
            "request {req} already has tables"
        );
        let bs = self.block_size;
        let groups = self.groups.len();
        let found = |g: usize| -> Vec<BlockId> {
            let t = prefix.tables.get(g).map_or(&[][..], Vec::as_slice);
            t.iter().copied().filter(|&b| b != NULL_BLOCK).collect()
        };
        let per_table = (prefix.blocks * bs + num_new)
            .div_ceil(bs)
            .saturating_sub(prefix.blocks);
        let new_blocks = per_table * groups;
        // Cached blocks nobody holds sit in the free list: taking them shrinks what is left to allocate.
        let idle = (0..groups)
            .flat_map(found)
            .filter(|&b| self.pool.ref_count(b) == 0)
            .count();
        let free = self.pool.num_free();
        if new_blocks + idle > free {
            return Err(EngineError::OutOfBlocks {
                needed: new_blocks + idle,
                free,
            });
        }
        for g in 0..groups {
            self.pool.touch(&found(g));
        }
        let mut fresh = self
            .pool
            .allocate(new_blocks)
            .expect("free count checked above")
            .into_iter();
        let t = self.tables.entry(req).or_default();
        t.groups = (0..groups)
            .map(|g| {
                let mut table = prefix.tables.get(g).cloned().unwrap_or_default();
                table.resize(prefix.blocks, NULL_BLOCK);
                table.extend(fresh.by_ref().take(per_table));
                table
            })
            .collect();
        t.num_registered = prefix.blocks;
        Ok(&t.groups)
    }

    /// Registers `req`'s leading blocks under `hashes` (one per block whose tokens are all computed),
    /// in every group; blocks registered before, and entries given back, are skipped.
    pub fn cache_full_blocks(&mut self, req: RequestId, hashes: &[BlockHash]) {
        let Some(t) = self.tables.get_mut(&req) else {
            return;
        };
        let len = t.groups.iter().map(Vec::len).min().unwrap_or(0);
        let upto = hashes.len().min(len);
        for (g, table) in t.groups.iter().enumerate() {
            for i in t.num_registered..upto {
                if table[i] != NULL_BLOCK {
                    // `false` means another request computed the same block at the same time: its
                    // copy stays the cached one and this block is freed uncached.
                    self.pool.register(table[i], hashes[i].for_group(g));
                }
            }
        }
        t.num_registered = t.num_registered.max(upto);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::hash::{HashExtras, hash_full_blocks};
    use crate::kv::{KvGroups, NULL_BLOCK};

    /// A single-group prefix of `blocks`.
    fn found(blocks: &[BlockId]) -> CachedPrefix {
        CachedPrefix {
            blocks: blocks.len(),
            tables: vec![blocks.to_vec()],
        }
    }

    #[test]
    fn tables_grow_by_whole_blocks_and_free_returns_them() {
        let mut m = KvCacheManager::new(FreeListPool::new(4), 4);
        assert_eq!(m.allocate_slots(1, 0, 5).unwrap()[0], &[0, 1]);
        assert_eq!(m.allocate_slots(1, 5, 3).unwrap()[0], &[0, 1]); // 8 tokens still fit in 2 blocks
        assert_eq!(m.allocate_slots(2, 0, 4).unwrap()[0], &[2]);
        assert_eq!(m.allocate_slots(1, 8, 1).unwrap()[0], &[0, 1, 3]);
        let err = m.allocate_slots(2, 4, 1).unwrap_err();
        assert!(matches!(err, EngineError::OutOfBlocks { needed: 1, free: 0 }));
        assert!(m.allocate_slots(9, 0, 1).is_err());
        assert_eq!(
            m.num_tables(),
            2,
            "a request refused its first block holds no table"
        );
        assert_eq!(m.block_table(2), &[2], "a failed allocation changes nothing");
        assert_eq!(m.usage(), 1.0);
        m.free(1);
        assert_eq!(m.pool().num_free(), 3);
        // Freed tail first: 3, 1, 0.
        assert_eq!(m.allocate_slots(2, 4, 1).unwrap()[0], &[2, 3]);
    }

    #[test]
    fn truncate_frees_the_tail_past_the_kept_tokens() {
        let mut m = KvCacheManager::new(PrefixCachingPool::new(6), 4);
        let hashes = hash_full_blocks(&[1, 2, 3, 4, 5, 6, 7, 8], 4, &HashExtras::scope("t"));
        // 5 computed tokens + 6 speculative positions: 11 slots, 3 blocks.
        assert_eq!(m.allocate_slots(1, 0, 11).unwrap()[0], &[0, 1, 2]);
        m.cache_full_blocks(1, &hashes[..1]);
        // Two drafts accepted: 8 valid tokens → 2 blocks; block 2 (drafts only) returns uncached.
        m.truncate(1, 8);
        assert_eq!(m.block_table(1), &[0, 1]);
        let p = m.pool();
        assert_eq!((p.num_in_use(), p.num_cached(), p.num_free_uncached()), (2, 0, 4));
        assert_eq!(p.block_hash(2), None);
        // Keeping more than the table holds, or exactly it, changes nothing.
        m.truncate(1, 8);
        m.truncate(1, 20);
        m.truncate(7, 0);
        assert_eq!(m.block_table(1), &[0, 1]);
        // A partly filled block is kept.
        m.truncate(1, 5);
        assert_eq!(m.block_table(1), &[0, 1]);
        m.truncate(1, 4);
        assert_eq!(m.block_table(1), &[0]);
        assert_eq!(
            m.cached_prefix(&hashes, usize::MAX).tables[0],
            vec![0],
            "the registered block stays"
        );
        m.pool().check_invariants();
    }

    #[test]
    fn prefix_blocks_are_shared_registered_and_evicted_tail_first() {
        let bs = 2;
        let mut m = KvCacheManager::new(PrefixCachingPool::new(6), bs);
        let scope = HashExtras::scope("t");
        let prompt = [1, 2, 3, 4, 5];
        let hashes = hash_full_blocks(&prompt, bs, &scope);
        assert_eq!(hashes.len(), 2);
        assert!(
            m.cached_prefix(&hashes, usize::MAX).tables[0].is_empty(),
            "cold cache"
        );
        assert_eq!(m.allocate_with_prefix(1, &found(&[]), 5).unwrap()[0], &[0, 1, 2]);
        // Only the first block has been computed so far (a 2-token chunk).
        m.cache_full_blocks(1, &hashes[..1]);
        assert_eq!(m.cached_prefix(&hashes, usize::MAX).tables[0], vec![0]);
        m.cache_full_blocks(1, &hashes);
        assert_eq!(m.cached_prefix(&hashes, usize::MAX).tables[0], vec![0, 1]);
        // A second request with the same prompt shares both full blocks while the first still runs.
        assert_eq!(
            m.allocate_with_prefix(2, &found(&[0, 1]), 1).unwrap()[0],
            &[0, 1, 3]
        );
        assert_eq!((m.pool().ref_count(0), m.pool().ref_count(1)), (2, 2));
        // Another scope finds nothing.
        let other = hash_full_blocks(&prompt, bs, &HashExtras::scope("u"));
        assert!(m.cached_prefix(&other, usize::MAX).tables[0].is_empty());
        m.free(1);
        m.free(2);
        let p = m.pool();
        assert_eq!((p.num_in_use(), p.num_cached(), p.num_free_uncached()), (0, 2, 4));
        // Reallocation takes uncached blocks first (4, 5, then the uncached tails 2 and 3), then evicts the LRU
        // cached one — request 2's tail freed before its prefix, so block 1 goes before block 0.
        assert_eq!(
            m.allocate_with_prefix(3, &found(&[]), 10).unwrap()[0],
            &[4, 5, 2, 3, 1]
        );
        assert_eq!(
            m.cached_prefix(&hashes, usize::MAX).tables[0],
            vec![0],
            "block 1 was evicted, block 0 is still cached"
        );
        let err = m.allocate_with_prefix(4, &found(&[0]), 1).unwrap_err();
        assert!(matches!(err, EngineError::OutOfBlocks { needed: 2, free: 1 }));
        assert_eq!(m.pool().ref_count(0), 0, "a failed allocation takes no reference");
        m.free(3);
        assert_eq!(m.allocate_with_prefix(4, &found(&[0]), 1).unwrap()[0], &[0, 1]);
        assert_eq!(m.pool().num_in_use(), 2);
    }

    #[test]
    fn a_window_group_gives_back_what_no_query_sees_and_its_prefix_needs_only_the_window() {
        let bs = 2;
        // Group 0 full attention, group 1 a window of 3 positions.
        let groups = KvGroups::new(&[None, Some(3)]);
        let mut m = KvCacheManager::with_groups(PrefixCachingPool::new(20), bs, &groups);
        let prompt: Vec<u32> = (1..=9).collect();
        let hashes = hash_full_blocks(&prompt, bs, &HashExtras::scope("t"));
        let t = m.allocate_slots(1, 0, 8).unwrap().to_vec();
        assert_eq!((t[0].len(), t[1].len()), (4, 4));
        m.cache_full_blocks(1, &hashes);
        // Decoding position 8, the query sees 6..=8: the window group's blocks 0–2 go back (cached).
        let t = m.allocate_slots(1, 8, 1).unwrap().to_vec();
        assert_eq!(t[1][..3], [NULL_BLOCK; 3]);
        assert!(t[0].iter().chain(&t[1][3..]).all(|&b| b != NULL_BLOCK));
        assert_eq!((m.pool().num_in_use(), m.pool().num_cached()), (7, 3));
        assert_eq!(m.num_table_blocks(), 7);
        // The same prompt again: 4 blocks found; the window group needs only block 3 (positions 6, 7).
        let found = m.cached_prefix(&hashes, (prompt.len() - 1) / bs);
        assert_eq!(found.blocks, 4);
        assert_eq!(found.tables[0], t[0][..4]);
        assert_eq!(found.tables[1], [NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, t[1][3]]);
        let t2 = m.allocate_with_prefix(2, &found, 1).unwrap().to_vec();
        assert_eq!(t2[1][..4], found.tables[1][..]);
        assert_eq!(t2[1].len(), 5);
        m.free(1);
        m.free(2);
        let p = m.pool();
        assert_eq!(p.num_in_use(), 0);
        p.check_invariants();
        // Group 1's blocks are cached under their own keys: group 0's hash finds group 0's block only.
        assert_eq!(m.cached_prefix(&hashes[..1], 1).tables[0], t[0][..1]);
        assert_ne!(
            m.pool().lookup(&hashes[0]),
            m.pool().lookup(&hashes[0].for_group(1))
        );
    }
}
