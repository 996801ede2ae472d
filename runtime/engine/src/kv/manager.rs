//! Request level of the KV cache: each request's block table, grown as the scheduler grants it tokens
//! and released when it finishes or is preempted (vLLM v1's `KVCacheManager.allocate_slots` / `free`).
//!
//! Invariants: after `allocate_slots(req, computed, new)` succeeds, `block_table(req)` covers
//! `computed + new` tokens; on failure nothing changed, so the scheduler can preempt and retry.

use super::block_pool::{BlockId, BlockPool, FreeListPool};
use crate::error::{EngineError, Result};
use std::collections::HashMap;

/// The scheduler's id for a request.
pub type RequestId = u64;

/// Block tables of the running requests over one pool.
pub struct KvCacheManager<P: BlockPool = FreeListPool> {
    pool: P,
    block_size: usize,
    tables: HashMap<RequestId, Vec<BlockId>>,
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
        let have = self.tables.get(&req).map_or(0, Vec::len);
        if needed_total > have {
            let needed = needed_total - have;
            let free = self.pool.num_free();
            let blocks = self
                .pool
                .allocate(needed)
                .ok_or(EngineError::OutOfBlocks { needed, free })?;
            self.tables.entry(req).or_default().extend(blocks);
        }
        Ok(self.tables.entry(req).or_default())
    }

    /// `req`'s block table (empty if it has none).
    pub fn block_table(&self, req: RequestId) -> &[BlockId] {
        self.tables.get(&req).map_or(&[], Vec::as_slice)
    }

    /// Releases every block of `req`.
    pub fn free(&mut self, req: RequestId) {
        if let Some(blocks) = self.tables.remove(&req) {
            self.pool.free(&blocks);
        }
    }

    /// Fraction of blocks held by requests (0–1).
    pub fn usage(&self) -> f32 {
        let total = self.pool.num_blocks().max(1);
        (total - self.pool.num_free()) as f32 / total as f32
    }

    /// The pool (for its counts).
    pub fn pool(&self) -> &P {
        &self.pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(m.allocate_slots(2, 4, 1).unwrap(), &[2, 0]);
    }
}
