//! Request level of the KV cache: each request's block table, grown as the scheduler grants it tokens
//! and released when it finishes or is preempted (vLLM v1's `KVCacheManager`: `get_computed_blocks`,
//! `allocate_slots`, `cache_blocks`, `free`).
//!
//! Invariants:
//! - after an allocation succeeds, `block_table(req)` covers every token the scheduler granted; on
//!   failure nothing changed, so the scheduler can preempt and retry;
//! - KV is allocated as tokens are granted, never reserved ahead: a table holds
//!   `ceil(granted tokens / block_size)` blocks, so at most one block per request is partly empty;
//! - with a [`PrefixCachingPool`], only blocks whose tokens have all been computed are registered
//!   (by their hash chain, which includes the tenant scope), and a request's blocks are freed tail
//!   first, so under pressure the shared beginning of a prompt is the last thing evicted.

use super::block_pool::{BlockId, BlockPool, FreeListPool};
use super::hash::BlockHash;
use super::prefix_pool::PrefixCachingPool;
use crate::error::{EngineError, Result};
use std::collections::HashMap;

/// The scheduler's id for a request.
pub type RequestId = u64;

/// One request's blocks.
#[derive(Default)]
struct Table {
    blocks: Vec<BlockId>,
    /// Leading blocks already registered in the prefix cache (or found there).
    num_registered: usize,
}

/// Block tables of the running requests over one pool.
pub struct KvCacheManager<P: BlockPool = FreeListPool> {
    pool: P,
    block_size: usize,
    tables: HashMap<RequestId, Table>,
}

impl<P: BlockPool> KvCacheManager<P> {
    /// A manager over `pool` with blocks of `block_size` tokens.
    pub fn new(pool: P, block_size: usize) -> Self {
        Self {
            pool,
            block_size,
            tables: HashMap::new(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Makes `req`'s table cover `num_computed + num_new` tokens, allocating blocks as needed.
    pub fn allocate_slots(
        &mut self,
        req: RequestId,
        num_computed: usize,
        num_new: usize,
    ) -> Result<&[BlockId]> {
        let needed_total = (num_computed + num_new).div_ceil(self.block_size);
        let have = self.tables.get(&req).map_or(0, |t| t.blocks.len());
        if needed_total > have {
            let needed = needed_total - have;
            let free = self.pool.num_free();
            let blocks = self
                .pool
                .allocate(needed)
                .ok_or(EngineError::OutOfBlocks { needed, free })?;
            self.tables.entry(req).or_default().blocks.extend(blocks);
        }
        Ok(&self.tables.entry(req).or_default().blocks)
    }

    /// `req`'s block table (empty if it has none).
    pub fn block_table(&self, req: RequestId) -> &[BlockId] {
        self.tables.get(&req).map_or(&[], |t| t.blocks.as_slice())
    }

    /// Releases every block of `req`, last block first.
    pub fn free(&mut self, req: RequestId) {
        if let Some(mut t) = self.tables.remove(&req) {
            t.blocks.reverse();
            self.pool.free(&t.blocks);
        }
    }

    /// Shrinks `req`'s table to cover its first `num_tokens` tokens, freeing the blocks past them, last
    /// first (speculative decoding's rollback: positions of rejected drafts give their slots back; a
    /// partly filled last block is kept and its stale slots are overwritten when those positions are
    /// computed again). Registered blocks are never released this way: they hold computed tokens, and
    /// callers truncate only past the computed ones.
    pub fn truncate(&mut self, req: RequestId, num_tokens: usize) {
        let keep = num_tokens.div_ceil(self.block_size);
        if let Some(t) = self.tables.get_mut(&req)
            && t.blocks.len() > keep
        {
            debug_assert!(
                t.num_registered <= keep,
                "request {req}: truncating registered blocks"
            );
            let mut tail = t.blocks.split_off(keep);
            tail.reverse();
            self.pool.free(&tail);
            t.num_registered = t.num_registered.min(keep);
        }
    }

    /// Requests holding a table.
    pub fn num_tables(&self) -> usize {
        self.tables.len()
    }

    /// Blocks held in all tables, counting a shared block once per table.
    pub fn num_table_blocks(&self) -> usize {
        self.tables.values().map(|t| t.blocks.len()).sum()
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

impl KvCacheManager<PrefixCachingPool> {
    /// The longest run of leading blocks of a request whose full-block hashes are `hashes` that the
    /// cache holds now (in use by others or cached); no reference is taken.
    pub fn cached_prefix(&self, hashes: &[BlockHash]) -> Vec<BlockId> {
        hashes.iter().map_while(|h| self.pool.lookup(h)).collect()
    }

    /// Starts `req`'s table with the cached blocks `prefix` (from [`Self::cached_prefix`], just now)
    /// and grows it to cover `num_new` more tokens. All or nothing: on failure no reference was taken.
    pub fn allocate_with_prefix(
        &mut self,
        req: RequestId,
        prefix: &[BlockId],
        num_new: usize,
    ) -> Result<&[BlockId]> {
        debug_assert!(
            self.block_table(req).is_empty(),
            "request {req} already has a table"
        );
        let new_blocks = (prefix.len() * self.block_size + num_new)
            .div_ceil(self.block_size)
            .saturating_sub(prefix.len());
        // Cached blocks nobody holds sit in the free list: taking them shrinks what is left to allocate.
        let idle = prefix.iter().filter(|&&b| self.pool.ref_count(b) == 0).count();
        let free = self.pool.num_free();
        if new_blocks + idle > free {
            return Err(EngineError::OutOfBlocks {
                needed: new_blocks + idle,
                free,
            });
        }
        self.pool.touch(prefix);
        let fresh = self.pool.allocate(new_blocks).expect("free count checked above");
        let t = self.tables.entry(req).or_default();
        t.blocks.extend_from_slice(prefix);
        t.blocks.extend(fresh);
        t.num_registered = prefix.len();
        Ok(&t.blocks)
    }

    /// Registers `req`'s leading blocks under `hashes` (one per block whose tokens are all computed);
    /// blocks registered before are skipped.
    pub fn cache_full_blocks(&mut self, req: RequestId, hashes: &[BlockHash]) {
        let Some(t) = self.tables.get_mut(&req) else {
            return;
        };
        let upto = hashes.len().min(t.blocks.len());
        let new = t.num_registered..upto;
        for (&b, &h) in t.blocks[new.clone()].iter().zip(&hashes[new]) {
            // `false` means another request computed the same block at the same time: its copy stays
            // the cached one and this block is freed uncached.
            self.pool.register(b, h);
        }
        t.num_registered = t.num_registered.max(upto);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::hash::{HashExtras, hash_full_blocks};

    #[test]
    fn tables_grow_by_whole_blocks_and_free_returns_them() {
        let mut m = KvCacheManager::new(FreeListPool::new(4), 4);
        assert_eq!(m.allocate_slots(1, 0, 5).unwrap(), &[0, 1]);
        assert_eq!(m.allocate_slots(1, 5, 3).unwrap(), &[0, 1]); // 8 tokens still fit in 2 blocks
        assert_eq!(m.allocate_slots(2, 0, 4).unwrap(), &[2]);
        assert_eq!(m.allocate_slots(1, 8, 1).unwrap(), &[0, 1, 3]);
        let err = m.allocate_slots(2, 4, 1).unwrap_err();
        assert!(matches!(err, EngineError::OutOfBlocks { needed: 1, free: 0 }));
        assert_eq!(m.block_table(2), &[2], "a failed allocation changes nothing");
        assert_eq!(m.usage(), 1.0);
        m.free(1);
        assert_eq!(m.pool().num_free(), 3);
        // Freed tail first: 3, 1, 0.
        assert_eq!(m.allocate_slots(2, 4, 1).unwrap(), &[2, 3]);
    }

    #[test]
    fn truncate_frees_the_tail_past_the_kept_tokens() {
        let mut m = KvCacheManager::new(PrefixCachingPool::new(6), 4);
        let hashes = hash_full_blocks(&[1, 2, 3, 4, 5, 6, 7, 8], 4, &HashExtras::scope("t"));
        // 5 computed tokens + 6 speculative positions: 11 slots, 3 blocks.
        assert_eq!(m.allocate_slots(1, 0, 11).unwrap(), &[0, 1, 2]);
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
        assert_eq!(m.cached_prefix(&hashes), vec![0], "the registered block stays");
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
        assert!(m.cached_prefix(&hashes).is_empty(), "cold cache");
        assert_eq!(m.allocate_with_prefix(1, &[], 5).unwrap(), &[0, 1, 2]);
        // Only the first block has been computed so far (a 2-token chunk).
        m.cache_full_blocks(1, &hashes[..1]);
        assert_eq!(m.cached_prefix(&hashes), vec![0]);
        m.cache_full_blocks(1, &hashes);
        assert_eq!(m.cached_prefix(&hashes), vec![0, 1]);
        // A second request with the same prompt shares both full blocks while the first still runs.
        assert_eq!(m.allocate_with_prefix(2, &[0, 1], 1).unwrap(), &[0, 1, 3]);
        assert_eq!((m.pool().ref_count(0), m.pool().ref_count(1)), (2, 2));
        // Another scope finds nothing.
        let other = hash_full_blocks(&prompt, bs, &HashExtras::scope("u"));
        assert!(m.cached_prefix(&other).is_empty());
        m.free(1);
        m.free(2);
        let p = m.pool();
        assert_eq!((p.num_in_use(), p.num_cached(), p.num_free_uncached()), (0, 2, 4));
        // Reallocation takes uncached blocks first (4, 5, then the uncached tails 2 and 3), then evicts the LRU
        // cached one — request 2's tail freed before its prefix, so block 1 goes before block 0.
        assert_eq!(m.allocate_with_prefix(3, &[], 10).unwrap(), &[4, 5, 2, 3, 1]);
        assert_eq!(
            m.cached_prefix(&hashes),
            vec![0],
            "block 1 was evicted, block 0 is still cached"
        );
        let err = m.allocate_with_prefix(4, &[0], 1).unwrap_err();
        assert!(matches!(err, EngineError::OutOfBlocks { needed: 2, free: 1 }));
        assert_eq!(m.pool().ref_count(0), 0, "a failed allocation takes no reference");
        m.free(3);
        assert_eq!(m.allocate_with_prefix(4, &[0], 1).unwrap(), &[0, 1]);
        assert_eq!(m.pool().num_in_use(), 2);
    }
}
