//! Tiny pools with exact expectations (ids, ref counts, eviction order), then a randomized invariant test.

use super::*;
use crate::kv::hash::{HashExtras, TokenId, hash_full_blocks};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

const A: HashExtras<'static> = HashExtras {
    scope: "tenant-a",
    adapter_digest: None,
    cache_salt: None,
};
const B: HashExtras<'static> = HashExtras {
    scope: "tenant-b",
    adapter_digest: None,
    cache_salt: None,
};

/// Block hashes of `tokens` in blocks of 2.
fn chain(tokens: &[TokenId], extras: HashExtras<'_>) -> Vec<BlockHash> {
    hash_full_blocks(tokens, 2, &extras)
}

/// `(free_uncached, in_use, cached)`, after checking the invariants.
fn counts(p: &PrefixCachingPool) -> (usize, usize, usize) {
    p.check_invariants();
    (p.num_free_uncached(), p.num_in_use(), p.num_cached())
}

#[test]
fn fresh_pool_hands_out_ids_in_order_until_empty() {
    let mut p = PrefixCachingPool::new(4);
    assert_eq!(counts(&p), (4, 0, 0));
    let got: Vec<_> = (0..5).map(|_| p.allocate_block()).collect();
    assert_eq!(got, vec![Some(0), Some(1), Some(2), Some(3), None]);
    assert_eq!(counts(&p), (0, 4, 0));
    assert!((0..4).all(|b| p.ref_count(b) == 1));
}

#[test]
fn freed_blocks_are_reused_least_recently_freed_first() {
    let mut p = PrefixCachingPool::new(4);
    for _ in 0..3 {
        p.allocate_block();
    }
    p.free_block(1);
    p.free_block(0);
    // Free list: [3 (never used), 1, 0].
    assert_eq!(counts(&p), (3, 1, 0));
    let got: Vec<_> = (0..4).map(|_| p.allocate_block()).collect();
    assert_eq!(got, vec![Some(3), Some(1), Some(0), None]);
}

#[test]
fn freed_cached_block_is_found_by_its_hash_until_reallocated() {
    let mut p = PrefixCachingPool::new(4);
    let h = chain(&[7, 8], A)[0];
    assert_eq!(p.allocate_block(), Some(0));
    assert!(p.register(0, h));
    assert_eq!(p.lookup(&h), Some(0), "an in-use full block is shareable");
    p.free_block(0);
    assert_eq!(counts(&p), (3, 0, 1));
    assert_eq!(p.lookup(&h), Some(0), "freeing keeps the hash");

    p.touch(&[0]);
    assert_eq!((p.ref_count(0), counts(&p)), (1, (3, 1, 0)));
    p.free_block(0); // free list: [1, 2, 3, 0]
    assert_eq!(p.allocate_block(), Some(1));
    assert_eq!(p.allocate_block(), Some(2));
    assert_eq!(p.allocate_block(), Some(3));
    assert_eq!(
        p.lookup(&h),
        Some(0),
        "still cached: nothing needed its block yet"
    );
    assert_eq!(counts(&p), (0, 3, 1));
    assert_eq!(
        p.allocate_block(),
        Some(0),
        "the cached block is reallocated last"
    );
    assert_eq!(p.lookup(&h), None, "and only then evicted");
    assert_eq!(p.block_hash(0), None);
    assert_eq!(counts(&p), (0, 4, 0));
}

#[test]
fn eviction_takes_the_least_recently_freed_cached_block_first() {
    let mut p = PrefixCachingPool::new(4);
    let hs = chain(&[1, 2, 3, 4, 5, 6, 7, 8], A);
    for (i, h) in hs.iter().enumerate() {
        assert_eq!(p.allocate_block(), Some(i as BlockId));
        assert!(p.register(i as BlockId, *h));
    }
    for b in [2, 0, 3, 1] {
        p.free_block(b);
    }
    assert_eq!(counts(&p), (0, 0, 4));
    assert_eq!(p.allocate_block(), Some(2));
    assert_eq!(
        p.lookup(&hs[2]),
        None,
        "block 2 was freed first, so it is evicted first"
    );
    assert_eq!(p.lookup(&hs[0]), Some(0));
    assert_eq!(p.allocate_block(), Some(0));
    // Reusing block 3 takes it off the free list: it can no longer be evicted.
    let b3 = p.lookup(&hs[3]).unwrap();
    p.incref(b3);
    assert_eq!(counts(&p), (0, 3, 1));
    assert_eq!(p.allocate_block(), Some(1));
    assert_eq!(p.allocate_block(), None);
    assert_eq!(p.lookup(&hs[3]), Some(3));
    assert_eq!((p.ref_count(3), counts(&p)), (1, (0, 4, 0)));
}

#[test]
fn shared_blocks_count_references_and_free_only_at_zero() {
    let mut p = PrefixCachingPool::new(4);
    let h = chain(&[1, 2], A)[0];
    let b = p.allocate_block().unwrap();
    assert!(p.register(b, h));
    // A second request hits the cache while the first still holds the block.
    let hit = p.lookup(&h).unwrap();
    p.incref(hit);
    assert_eq!((hit, p.ref_count(0)), (0, 2));
    p.free_block(0);
    assert_eq!((p.ref_count(0), counts(&p)), (1, (3, 1, 0)));
    p.free_block(0);
    assert_eq!((p.ref_count(0), counts(&p)), (0, (3, 0, 1)));
}

#[test]
fn a_hash_of_another_scope_never_matches() {
    let mut p = PrefixCachingPool::new(6);
    let tokens = [1, 2, 3, 4, 5, 6];
    for (i, h) in chain(&tokens, A).into_iter().enumerate() {
        assert_eq!(p.allocate_block(), Some(i as BlockId));
        assert!(p.register(i as BlockId, h));
    }
    let salted = HashExtras {
        cache_salt: Some("x"),
        ..A
    };
    let adapted = HashExtras {
        adapter_digest: Some("x"),
        ..A
    };
    for other in [B, salted, adapted] {
        for h in chain(&tokens, other) {
            assert_eq!(p.lookup(&h), None, "{other:?} must not see tenant-a's blocks");
        }
    }
    let hits: Vec<_> = chain(&tokens, A).iter().map(|h| p.lookup(h)).collect();
    assert_eq!(hits, vec![Some(0), Some(1), Some(2)]);
}

#[test]
fn registering_a_duplicate_keeps_the_first_copy() {
    let mut p = PrefixCachingPool::new(4);
    let h = chain(&[1, 2], A)[0];
    let (x, y) = (p.allocate_block().unwrap(), p.allocate_block().unwrap());
    assert!(p.register(x, h));
    assert!(
        p.register(x, h),
        "registering again under the same hash is a no-op"
    );
    assert!(
        !p.register(y, h),
        "two requests computed the same block; the first copy wins"
    );
    assert_eq!((p.lookup(&h), p.block_hash(y)), (Some(x), None));
    p.free_block(y);
    p.free_block(x);
    assert_eq!(counts(&p), (3, 0, 1));
}

#[test]
fn block_pool_trait_allocates_all_or_nothing() {
    let mut p = PrefixCachingPool::new(4);
    let h = chain(&[1, 2], A)[0];
    let got = BlockPool::allocate(&mut p, 3).unwrap();
    assert_eq!(got, vec![0, 1, 2]);
    assert!(p.register(1, h));
    BlockPool::free(&mut p, &[1]);
    assert_eq!(
        (p.num_free(), p.num_blocks()),
        (2, 4),
        "a cached block counts as free"
    );
    assert_eq!(BlockPool::allocate(&mut p, 3), None);
    assert_eq!(counts(&p), (1, 2, 1), "a refused allocation changes nothing");
    assert_eq!(BlockPool::allocate(&mut p, 2), Some(vec![3, 1]));
    assert_eq!(p.lookup(&h), None);
}

#[test]
#[should_panic(expected = "freed while not in use")]
fn double_free_panics() {
    let mut p = PrefixCachingPool::new(2);
    let b = p.allocate_block().unwrap();
    p.free_block(b);
    p.free_block(b);
}

#[test]
#[should_panic(expected = "free and uncached")]
fn incref_of_a_free_uncached_block_panics() {
    PrefixCachingPool::new(2).incref(1);
}

/// The cache key a hash was computed under: (scope, with adapter, with salt).
type Key = (usize, bool, bool);

/// One simulated request: the hashes of its prompt's full blocks and the blocks it holds.
struct Req {
    key: Key,
    hashes: Vec<BlockHash>,
    /// Blocks it will hold once fully computed (full blocks plus a partial one, if any).
    target: usize,
    blocks: Vec<BlockId>,
}

fn new_req(rng: &mut ChaCha8Rng) -> Req {
    let key: Key = (rng.random_range(0..2), rng.random_bool(0.2), rng.random_bool(0.2));
    // Tiny vocabulary and blocks of 2: many requests share prefixes, so lookups hit often.
    let n: usize = rng.random_range(1..10);
    let tokens: Vec<TokenId> = (0..n).map(|_| rng.random_range(0..2)).collect();
    // The adapter digest and the salt carry the same string: typed extras must keep them apart.
    let extras = HashExtras {
        scope: ["tenant-a", "tenant-b"][key.0],
        adapter_digest: key.1.then_some("same"),
        cache_salt: key.2.then_some("same"),
    };
    Req {
        key,
        hashes: chain(&tokens, extras),
        target: n.div_ceil(2),
        blocks: Vec::new(),
    }
}

fn release(p: &mut PrefixCachingPool, r: Req) {
    // Tail first, as vLLM frees, so a request's last blocks are evicted before its prefix.
    for &b in r.blocks.iter().rev() {
        p.free_block(b);
    }
}

#[test]
fn random_operations_keep_every_invariant() {
    let (mut hits, mut evictions, mut rejected_dups) = (0, 0, 0);
    for seed in 0..4 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut p = PrefixCachingPool::new(8);
        let mut reqs: Vec<Req> = Vec::new();
        // Which key registered each block still holding a hash, and which key produced each hash.
        let mut registered_by: HashMap<BlockId, Key> = HashMap::new();
        let mut hash_key: HashMap<BlockHash, Key> = HashMap::new();
        for _ in 0..3000 {
            match rng.random_range(0..10) {
                // Admit: reuse the longest cached prefix.
                0..=2 if reqs.len() < 6 => {
                    let mut r = new_req(&mut rng);
                    for h in &r.hashes {
                        let prev = hash_key.insert(*h, r.key);
                        assert!(prev.is_none_or(|k| k == r.key), "one hash under two keys");
                    }
                    for h in &r.hashes {
                        let Some(b) = p.lookup(h) else { break };
                        assert_eq!(p.block_hash(b), Some(*h));
                        assert_eq!(registered_by[&b], r.key, "lookup returned another scope's block");
                        p.incref(b);
                        r.blocks.push(b);
                        hits += 1;
                    }
                    reqs.push(r);
                }
                // Compute one more block of a request; register it once full. Out of blocks: preempt.
                3..=7 if !reqs.is_empty() => {
                    let i = rng.random_range(0..reqs.len());
                    let r = &mut reqs[i];
                    if r.blocks.len() == r.target {
                        continue;
                    }
                    match p.allocate_block() {
                        None => release(&mut p, reqs.swap_remove(i)),
                        Some(b) => {
                            // A block that still had a hash is an eviction.
                            evictions += usize::from(registered_by.remove(&b).is_some());
                            let idx = r.blocks.len();
                            r.blocks.push(b);
                            if let Some(h) = r.hashes.get(idx) {
                                if p.register(b, *h) {
                                    registered_by.insert(b, r.key);
                                } else {
                                    rejected_dups += 1;
                                }
                            }
                        }
                    }
                }
                // Finish or cancel a request.
                8..=9 if !reqs.is_empty() => {
                    let i = rng.random_range(0..reqs.len());
                    release(&mut p, reqs.swap_remove(i));
                }
                _ => {}
            }
            p.check_invariants();
            let mut expected = [0u32; 8];
            for &b in reqs.iter().flat_map(|r| &r.blocks) {
                expected[b as usize] += 1;
            }
            for b in 0..8 {
                assert_eq!(p.ref_count(b), expected[b as usize], "ref count of block {b}");
            }
        }
    }
    // The run must have exercised what it checks.
    assert!(
        hits > 100 && evictions > 100 && rejected_dups > 0,
        "{hits} {evictions} {rejected_dups}"
    );
}
