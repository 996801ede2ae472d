//! Block level of the KV cache: hands out and takes back fixed-size blocks by id.
//!
//! Invariants: `num_free() + allocated == num_blocks()`; `allocate(n)` gives `n` distinct free ids or
//! nothing (never a partial allocation); freeing an id that is not allocated is a caller bug and is
//! reported by `debug_assert!`. Free blocks are reused in FIFO order (the order vLLM's free queue uses,
//! which matters once freed blocks keep cached prefixes).

use std::collections::VecDeque;

/// A block's index in the KV-cache storage.
pub type BlockId = u32;

/// The block-level allocator the [`super::KvCacheManager`] is written against.
pub trait BlockPool: Send {
    /// Blocks in the pool.
    fn num_blocks(&self) -> usize;
    /// Blocks available now.
    fn num_free(&self) -> usize;
    /// `n` blocks, or `None` (and no change) when fewer are free.
    fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>>;
    /// Returns blocks to the pool.
    fn free(&mut self, blocks: &[BlockId]);
}

/// The minimal pool: a FIFO free list.
#[derive(Debug)]
pub struct FreeListPool {
    total: usize,
    free: VecDeque<BlockId>,
    /// `allocated[id]` tells whether `id` is out; catches double frees in debug builds.
    allocated: Vec<bool>,
}

impl FreeListPool {
    /// A pool of `num_blocks` blocks, all free.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            total: num_blocks,
            free: (0..num_blocks as BlockId).collect(),
            allocated: vec![false; num_blocks],
        }
    }
}

impl BlockPool for FreeListPool {
    fn num_blocks(&self) -> usize {
        self.total
    }

    fn num_free(&self) -> usize {
        self.free.len()
    }

    fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.free.len() {
            return None;
        }
        let ids: Vec<BlockId> = self.free.drain(..n).collect();
        for &id in &ids {
            self.allocated[id as usize] = true;
        }
        Some(ids)
    }

    fn free(&mut self, blocks: &[BlockId]) {
        for &id in blocks {
            debug_assert!(self.allocated[id as usize], "block {id} freed twice");
            self.allocated[id as usize] = false;
            self.free.push_back(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_in_fifo_order_and_never_partially() {
        let mut p = FreeListPool::new(4);
        assert_eq!(p.allocate(3), Some(vec![0, 1, 2]));
        assert_eq!(p.allocate(2), None);
        assert_eq!(p.num_free(), 1);
        p.free(&[1, 0]);
        assert_eq!(p.allocate(3), Some(vec![3, 1, 0]));
        assert_eq!(p.num_free(), 0);
    }
}
