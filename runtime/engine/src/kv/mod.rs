//! The paged KV cache, in vLLM v1's layers: the scheduler asks the [`KvCacheManager`] (request level:
//! block tables) for slots; the manager takes blocks from a [`BlockPool`] (block level); the model reads
//! and writes the [`KvCache`] storage through the block tables.
//!
//! Invariants: with [`FreeListPool`] a block id is owned by at most one request's table at a time; with
//! [`PrefixCachingPool`] full blocks may be shared by reference count and stay cached (evictable, LRU) at
//! zero references, and `free uncached + in use + cached == total` at all times; a cached block is only
//! found through a [`hash`] chain that includes the tenant scope (and adapter digest and cache salt), so
//! no request sees another scope's block; a request's table always covers every token the model has been
//! asked to compute for it.
//!
//! Layers that attend alike share block tables: [`KvGroups`] (one group for most models; Gemma 3's
//! sliding-window layers in groups of their own, whose blocks are given back once they leave the
//! window).
//!
//! How many blocks there are is decided in one place, [`sizing`] (from `--num-kv-blocks`,
//! `--kv-cache-memory-bytes`, a memory limit, or the default).
//!
//! Block pools: the minimal [`FreeListPool`] (what the manager uses today) and the prefix-caching
//! [`PrefixCachingPool`] (Engine II; the manager's prefix lookup and block registration come with the
//! scheduler).

mod block_pool;
mod cache;
mod free_queue;
mod groups;
pub mod hash;
mod manager;
mod prefix_pool;
pub mod sizing;

pub use block_pool::{BlockId, BlockPool, FreeListPool};
pub use cache::KvCache;
pub use groups::{KvGroups, NULL_BLOCK, first_visible_block};
pub use hash::{BlockHash, HashExtras, TokenId, hash_block, hash_full_blocks};
pub use manager::{CachedPrefix, KvCacheManager, RequestId};
pub use prefix_pool::PrefixCachingPool;
