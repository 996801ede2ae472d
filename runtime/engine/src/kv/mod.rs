//! The paged KV cache, in vLLM v1's layers: the scheduler asks the [`KvCacheManager`] (request level:
//! block tables) for slots; the manager takes blocks from a [`BlockPool`] (block level); the model reads
//! and writes the [`KvCache`] storage through the block tables.
//!
//! Invariants: a block id is owned by at most one request's table at a time (until the next issue adds
//! shared prefix blocks with reference counts); `free + allocated == total` in the pool at all times;
//! a request's table always covers every token the model has been asked to compute for it.
//!
//! This issue ships the minimal [`FreeListPool`]; Engine II replaces it with the prefix-caching pool
//! (hashing, LRU eviction) behind the same [`BlockPool`] trait.

mod block_pool;
mod cache;
mod manager;

pub use block_pool::{BlockId, BlockPool, FreeListPool};
pub use cache::KvCache;
pub use manager::{KvCacheManager, RequestId};
