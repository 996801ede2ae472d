//! Block level of the KV cache with prefix caching (vLLM v1's `BlockPool`): reference-counted blocks,
//! an O(1) LRU free list, and a map from block hash to the block that holds that content.
//!
//! A block is in one of three states:
//! - in use: ref count > 0 (held by one or more requests' block tables);
//! - cached: ref count 0 with a hash — free, but still holding reusable KV, found by [`lookup`];
//! - free and uncached: ref count 0, no hash.
//!
//! Invariants (checked after every operation by the randomized test):
//! - `num_free_uncached() + num_in_use() + num_cached() == num_blocks()`;
//! - a block is in the free list exactly when its ref count is 0 — never free and referenced;
//! - every entry `hash → block` of the map points to a block whose stored hash is `hash`, and every
//!   block with a stored hash is the map's entry for it;
//! - eviction happens only when a free block is reallocated ([`allocate_block`] pops the least recently
//!   freed block and only then drops its hash), so a freed block stays reusable as long as possible.
//!
//! Scope isolation is not this layer's job: the tenant scope is part of every [`BlockHash`]
//! (see [`super::hash`]), so a chain computed in one scope never equals another scope's.
//!
//! [`lookup`]: PrefixCachingPool::lookup
//! [`allocate_block`]: PrefixCachingPool::allocate_block

use super::block_pool::{BlockId, BlockPool};
use super::free_queue::FreeQueue;
use super::hash::BlockHash;
use std::collections::HashMap;

/// A fixed pool of blocks with reference counts and a prefix cache of full blocks.
#[derive(Debug)]
pub struct PrefixCachingPool {
    /// `ref_counts[b]`: how many block tables hold `b`; 0 exactly when `b` is in `free`.
    ref_counts: Vec<u32>,
    /// `hashes[b]`: the hash `b` was registered under; kept after `b` is freed (that is what makes it
    /// reusable) and dropped only when `b` is reallocated.
    hashes: Vec<Option<BlockHash>>,
    /// Blocks with ref count 0, least recently freed first: the order they are reallocated, and evicted.
    free: FreeQueue,
    /// The block holding each cached hash, whatever its ref count.
    cached: HashMap<BlockHash, BlockId>,
    /// Blocks with ref count 0 and a hash (cached and evictable), kept so the counts are O(1).
    num_cached_free: usize,
}

impl PrefixCachingPool {
    /// A pool of `num_blocks` blocks, all free and uncached; a fresh pool hands out ids 0, 1, 2, ….
    pub fn new(num_blocks: usize) -> Self {
        Self {
            ref_counts: vec![0; num_blocks],
            hashes: vec![None; num_blocks],
            free: FreeQueue::full(num_blocks),
            cached: HashMap::with_capacity(num_blocks),
            num_cached_free: 0,
        }
    }

    /// Takes the least recently freed block (evicting its cached hash, if any) with ref count 1, or
    /// `None` when every block is in use.
    pub fn allocate_block(&mut self) -> Option<BlockId> {
        let b = self.free.pop_front()?;
        if let Some(h) = self.hashes[b as usize].take() {
            let removed = self.cached.remove(&h);
            debug_assert_eq!(removed, Some(b), "cache map out of sync for block {b}");
            self.num_cached_free -= 1;
        }
        self.ref_counts[b as usize] = 1;
        Some(b)
    }

    /// The block holding `hash`, in use or cached, without taking a reference.
    pub fn lookup(&self, hash: &BlockHash) -> Option<BlockId> {
        self.cached.get(hash).copied()
    }

    /// Takes one more reference to `block`, which must be in use or cached; a cached block leaves the
    /// free list (it is no longer evictable).
    pub fn incref(&mut self, block: BlockId) {
        let i = block as usize;
        if self.ref_counts[i] == 0 {
            assert!(
                self.hashes[i].is_some(),
                "block {block} is free and uncached: allocate it instead"
            );
            self.free.remove(block);
            self.num_cached_free -= 1;
        }
        self.ref_counts[i] += 1;
    }

    /// [`incref`](Self::incref) for each block, as when a request reuses a cached prefix.
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            self.incref(b);
        }
    }

    /// Records that `block` (in use, now full) holds the content hashed as `hash`. Returns `false`, and
    /// leaves `block` uncached, when another block already holds `hash` (two requests computed the same
    /// block at once); the first one stays the cached copy. Registering a block again under the same
    /// hash is a no-op; under a different one it is a caller bug and panics.
    pub fn register(&mut self, block: BlockId, hash: BlockHash) -> bool {
        let i = block as usize;
        assert!(
            self.ref_counts[i] > 0,
            "block {block} must be in use to be registered"
        );
        match self.hashes[i] {
            Some(h) if h == hash => return true,
            Some(h) => panic!("block {block} is already registered as {h:?}, not {hash:?}"),
            None => {}
        }
        if self.cached.contains_key(&hash) {
            return false;
        }
        self.cached.insert(hash, block);
        self.hashes[i] = Some(hash);
        true
    }

    /// Drops one reference to `block`; at 0 it goes to the most recently used end of the free list,
    /// keeping its hash so it can still be found by [`lookup`](Self::lookup). Freeing a block that is
    /// not in use is a caller bug and panics (it would corrupt the free list).
    pub fn free_block(&mut self, block: BlockId) {
        let i = block as usize;
        assert!(self.ref_counts[i] > 0, "block {block} freed while not in use");
        self.ref_counts[i] -= 1;
        if self.ref_counts[i] == 0 {
            self.free.push_back(block);
            if self.hashes[i].is_some() {
                self.num_cached_free += 1;
            }
        }
    }

    /// How many block tables hold `block`.
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_counts[block as usize]
    }

    /// The hash `block` is registered under, if any.
    pub fn block_hash(&self, block: BlockId) -> Option<BlockHash> {
        self.hashes[block as usize]
    }

    /// Blocks with ref count > 0.
    pub fn num_in_use(&self) -> usize {
        self.ref_counts.len() - self.free.len()
    }

    /// Blocks with ref count 0 that hold a cached hash (free, evictable, reusable).
    pub fn num_cached(&self) -> usize {
        self.num_cached_free
    }

    /// Blocks with ref count 0 and no hash.
    pub fn num_free_uncached(&self) -> usize {
        self.free.len() - self.num_cached_free
    }

    /// Checks every invariant of the module header, walking the whole pool (tests only).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let total = self.ref_counts.len();
        assert_eq!(
            self.num_free_uncached() + self.num_in_use() + self.num_cached(),
            total
        );
        let listed = self.free.to_vec_checked();
        for b in 0..total as BlockId {
            let rc = self.ref_counts[b as usize];
            assert_eq!(
                self.free.contains(b),
                rc == 0,
                "block {b}: free list vs ref count {rc}"
            );
            if let Some(h) = self.hashes[b as usize] {
                assert_eq!(
                    self.cached.get(&h),
                    Some(&b),
                    "block {b}'s hash is not mapped to it"
                );
            }
        }
        for (h, &b) in &self.cached {
            assert_eq!(
                self.hashes[b as usize],
                Some(*h),
                "map entry {h:?} → {b} is stale"
            );
        }
        let cached_free = listed
            .iter()
            .filter(|&&b| self.hashes[b as usize].is_some())
            .count();
        assert_eq!(cached_free, self.num_cached_free);
    }
}

/// The pool as the [`super::KvCacheManager`] sees it: `num_free` counts cached blocks too (they can be
/// reallocated), and `free` drops one reference per id, in the order given — pass a request's blocks
/// tail first, as vLLM does, so its last blocks are evicted before the shared prefix.
impl BlockPool for PrefixCachingPool {
    fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    fn num_free(&self) -> usize {
        self.free.len()
    }

    fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.free.len() {
            return None;
        }
        Some((0..n).filter_map(|_| self.allocate_block()).collect())
    }

    fn free(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            self.free_block(b);
        }
    }
}

#[cfg(test)]
mod tests;
