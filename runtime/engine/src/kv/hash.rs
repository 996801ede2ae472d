//! Block hashes for prefix caching: a SHA-256 chain `H(parent, block tokens, typed extras)` (vLLM v1's
//! `hash_block_tokens`), a pure function of its inputs.
//!
//! Invariants:
//! - Only full blocks are hashed; a partly filled block has no hash and is never shared.
//! - The encoding fed to SHA-256 is injective: a version tag, then fields in a fixed order, each with a
//!   one-byte type tag and a length prefix. So two different inputs never produce the same byte string —
//!   a salt equal to an adapter digest, or tokens that spell a scope, cannot collide with each other.
//! - The tenant scope is always part of every block's hash (not just the first), so a chain computed in
//!   one scope never matches a block cached by another, even at the root.

use sha2::{Digest, Sha256};
use std::fmt;

/// A token id as the tokenizer hands it out.
pub type TokenId = u32;

/// The hash of one full block and, through its parent, of every block before it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl BlockHash {
    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The key of this block in KV-cache group `g` ([`super::KvGroups`]): group 0 keeps the hash
    /// itself; another group's blocks of the same tokens hold other layers, so they are cached under
    /// the hash with its first eight bytes XORed with `g` — as unlikely to meet another chain's hash
    /// as any two SHA-256 digests are to agree.
    pub fn for_group(self, g: usize) -> Self {
        let mut b = self.0;
        for (x, y) in b.iter_mut().zip((g as u64).to_le_bytes()) {
            *x ^= y;
        }
        Self(b)
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Eight bytes are plenty to tell blocks apart in test failures and logs.
        write!(f, "BlockHash({}…)", hex::encode(&self.0[..8]))
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// What, besides the tokens, decides whether a cached block may be reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashExtras<'a> {
    /// The tenant scope the cache is partitioned by; always present.
    pub scope: &'a str,
    /// Content digest of the LoRA adapter in use, if any: the same tokens through another adapter give
    /// different KV.
    pub adapter_digest: Option<&'a str>,
    /// A per-request cache salt, if any: only requests with the same salt share blocks.
    pub cache_salt: Option<&'a str>,
}

impl<'a> HashExtras<'a> {
    /// Extras with only the tenant scope.
    pub fn scope(scope: &'a str) -> Self {
        Self {
            scope,
            adapter_digest: None,
            cache_salt: None,
        }
    }
}

/// Version of the encoding; bump it if the encoding changes so old and new hashes never mix.
const DOMAIN: &[u8] = b"modelfleet/kv-block/v1";

/// One-byte type tags of the encoded fields.
mod tag {
    pub const ROOT: u8 = 0x00;
    pub const PARENT: u8 = 0x01;
    pub const TOKENS: u8 = 0x02;
    pub const SCOPE: u8 = 0x10;
    pub const ADAPTER: u8 = 0x11;
    pub const SALT: u8 = 0x12;
}

fn field(h: &mut Sha256, tag: u8, bytes: &[u8]) {
    h.update([tag]);
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The hash of one full block: `tokens` follows the block hashed as `parent` (`None` for the first
/// block of a sequence), under `extras`.
pub fn hash_block(parent: Option<&BlockHash>, tokens: &[TokenId], extras: &HashExtras<'_>) -> BlockHash {
    let mut h = Sha256::new();
    h.update((DOMAIN.len() as u64).to_le_bytes());
    h.update(DOMAIN);
    match parent {
        None => field(&mut h, tag::ROOT, &[]),
        Some(p) => field(&mut h, tag::PARENT, &p.0),
    }
    h.update([tag::TOKENS]);
    h.update((tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    field(&mut h, tag::SCOPE, extras.scope.as_bytes());
    if let Some(a) = extras.adapter_digest {
        field(&mut h, tag::ADAPTER, a.as_bytes());
    }
    if let Some(s) = extras.cache_salt {
        field(&mut h, tag::SALT, s.as_bytes());
    }
    BlockHash(h.finalize().into())
}

/// Hashes of every full block of `tokens` (blocks of `block_size` tokens), chained from the first; the
/// trailing partial block, if any, gets none. `block_size` must be positive.
pub fn hash_full_blocks(tokens: &[TokenId], block_size: usize, extras: &HashExtras<'_>) -> Vec<BlockHash> {
    assert!(block_size > 0, "block_size must be positive");
    let mut out: Vec<BlockHash> = Vec::with_capacity(tokens.len() / block_size);
    for chunk in tokens.chunks_exact(block_size) {
        let next = hash_block(out.last(), chunk, extras);
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: HashExtras<'static> = HashExtras {
        scope: "tenant-a",
        adapter_digest: None,
        cache_salt: None,
    };

    fn root(tokens: &[TokenId], extras: HashExtras<'_>) -> BlockHash {
        hash_block(None, tokens, &extras)
    }

    #[test]
    fn same_inputs_same_hash() {
        let p = root(&[1, 2], A);
        assert_eq!(
            hash_block(Some(&p), &[3, 4], &A),
            hash_block(Some(&p), &[3, 4], &A)
        );
        assert_eq!(root(&[1, 2], A), p);
    }

    #[test]
    fn any_difference_changes_the_hash() {
        let p = root(&[1, 2], A);
        let q = root(&[1, 3], A);
        let base = hash_block(Some(&p), &[5, 6], &A);
        let with = |extras: HashExtras<'_>| hash_block(Some(&p), &[5, 6], &extras);
        let cases = [
            ("parent", hash_block(Some(&q), &[5, 6], &A)),
            ("no parent", hash_block(None, &[5, 6], &A)),
            ("tokens", hash_block(Some(&p), &[5, 7], &A)),
            ("token order", hash_block(Some(&p), &[6, 5], &A)),
            ("fewer tokens", hash_block(Some(&p), &[5], &A)),
            ("scope", with(HashExtras::scope("tenant-b"))),
            (
                "adapter",
                with(HashExtras {
                    adapter_digest: Some("sha256:aa"),
                    ..A
                }),
            ),
            (
                "salt",
                with(HashExtras {
                    cache_salt: Some("s"),
                    ..A
                }),
            ),
            (
                "empty salt",
                with(HashExtras {
                    cache_salt: Some(""),
                    ..A
                }),
            ),
        ];
        for (what, h) in cases {
            assert_ne!(h, base, "changing the {what} must change the hash");
        }
        let adapters = [Some("sha256:aa"), Some("sha256:ab")];
        assert_ne!(
            with(HashExtras {
                adapter_digest: adapters[0],
                ..A
            }),
            with(HashExtras {
                adapter_digest: adapters[1],
                ..A
            })
        );
    }

    #[test]
    fn extras_are_typed_so_a_salt_never_collides_with_an_adapter() {
        let id = "sha256:0123";
        let as_adapter = root(
            &[1],
            HashExtras {
                adapter_digest: Some(id),
                ..A
            },
        );
        let as_salt = root(
            &[1],
            HashExtras {
                cache_salt: Some(id),
                ..A
            },
        );
        assert_ne!(as_adapter, as_salt);
        // Length prefixes: moving bytes between fields changes the hash.
        let split1 = root(
            &[1],
            HashExtras {
                scope: "ab",
                adapter_digest: Some("c"),
                cache_salt: None,
            },
        );
        let split2 = root(
            &[1],
            HashExtras {
                scope: "a",
                adapter_digest: Some("bc"),
                cache_salt: None,
            },
        );
        assert_ne!(split1, split2);
    }

    #[test]
    fn only_full_blocks_are_hashed_and_they_chain() {
        let tokens: Vec<TokenId> = (0..10).collect();
        let hs = hash_full_blocks(&tokens, 4, &A);
        assert_eq!(
            hs.len(),
            2,
            "10 tokens in blocks of 4: two full blocks, the partial one unhashed"
        );
        assert_eq!(hs[0], hash_block(None, &[0, 1, 2, 3], &A));
        assert_eq!(hs[1], hash_block(Some(&hs[0]), &[4, 5, 6, 7], &A));
        assert_eq!(hash_full_blocks(&tokens[..3], 4, &A), vec![]);
        assert_eq!(hash_full_blocks(&tokens[..8], 4, &A), hs);
        // A shared prefix gives shared leading hashes; a different first block changes all of them.
        let mut other = tokens.clone();
        other[0] = 99;
        let ho = hash_full_blocks(&other, 4, &A);
        assert_ne!(ho[0], hs[0]);
        assert_ne!(ho[1], hs[1], "the chain carries the first block's difference");
    }
}
