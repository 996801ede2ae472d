//! How many KV blocks a runtime gets: the one place that turns a memory budget (or a block count, or
//! nothing) into a pool size, shared by `serve` and `plan` so the planner predicts exactly what the
//! server allocates.
//!
//! The arithmetic (docs/capacity.md):
//! - KV bytes per token = 2 (K and V) × layers × KV heads × head dim × bytes per element
//!   (`--kv-cache-dtype`); bytes per block = that × `--block-size`. With KV-cache groups
//!   ([`KvGroups`]: Gemma 3's sliding-window layers) a block holds one group's layers (the groups'
//!   width), and a request holds a block per group and `--block-size` tokens — but a window group only
//!   its window's ([`KvGroups::blocks_for`]): the blocks a request of `n` tokens needs come from there.
//! - From a memory limit: pool bytes = limit − weights (bytes as stored) − workspace (the step's
//!   activation and logits buffers at `--max-num-batched-tokens`, see
//!   [`crate::model::workspace_bytes`]) − headroom ([`headroom`]: the process itself, tokenizer, HTTP,
//!   allocator slack, adapters); blocks = ⌊pool bytes ÷ bytes per block⌋.
//! - From `--kv-cache-memory-bytes` (vLLM's flag): blocks = ⌊bytes ÷ bytes per block⌋.
//! - With a draft model (speculative decoding), its KV cache holds the same tokens as the pool plus
//!   each sequence's draft positions: a memory limit also loses the draft's weights and those extra
//!   blocks ([`Footprint::draft`]), and every block of the pool costs its own bytes plus the draft's
//!   ([`PoolInputs::draft_bytes_per_token`]); `--kv-cache-memory-bytes` covers both caches, as vLLM's
//!   covers every layer it caches.
//! - `--num-kv-blocks` is taken as given (it may be smaller than a context: such requests get 413).
//! - With none of them: [`default_pool_tokens`] (`--max-num-seqs` sequences of up to 2,048 tokens, at
//!   least one full context), the default before pools were sized from memory.
//!
//! Invariants: a pool sized from memory (a limit or `--kv-cache-memory-bytes`) holds at least one
//! request of `max_model_len` tokens, or sizing fails with an error naming every number; the result
//! carries its own derivation, so what the server logs is the arithmetic it used. Pure: no I/O.
//!
//! Design: vLLM sizes its pool the same way from `gpu_memory_utilization` (profile the forward pass,
//! subtract weights and activations, give the rest to the KV cache) and from `--kv-cache-memory-bytes`,
//! and refuses to start when the pool is shorter than `max_model_len`.

use super::KvGroups;
use crate::error::{EngineError, Result};
use modelfleet_kernels::KvDType;
use std::fmt;

/// Bytes in a MiB, for messages.
const MIB: f64 = 1024.0 * 1024.0;

/// Fixed part of the headroom: the runtime process beyond its weights, KV pool and step buffers
/// (binary, tokenizer, thread stacks, HTTP buffers, the allocator's slack). Measured at 20–40 MiB for
/// `serve` on the tiny and SmolLM2 models (docs/capacity.md); 64 MiB leaves margin.
pub const HEADROOM_FIXED_BYTES: u64 = 64 << 20;
/// Proportional part of the headroom: 5% of the limit (fragmentation and page-cache pressure grow with
/// the pool; vLLM keeps 10% of a GPU by default with `gpu_memory_utilization` 0.9).
pub const HEADROOM_PERCENT: u64 = 5;

/// The headroom kept out of a memory limit: [`HEADROOM_FIXED_BYTES`] + [`HEADROOM_PERCENT`]% of it.
pub fn headroom(limit: u64) -> u64 {
    HEADROOM_FIXED_BYTES + limit / 100 * HEADROOM_PERCENT
}

/// The tokens of the default pool: `max_num_seqs` sequences of up to 2,048 tokens, and at least one
/// full context so every request that fits the context can run. KV is allocated as tokens arrive, so
/// this bounds memory, not what one request may use.
pub fn default_pool_tokens(max_num_seqs: usize, max_model_len: usize) -> usize {
    (max_num_seqs.max(1) * max_model_len.min(2048)).max(max_model_len)
}

/// The blocks of the default pool: [`default_pool_tokens`] as `groups` hold them (a block per group
/// and `block_size` tokens, a window group's only up to its window).
pub fn default_pool_blocks(
    groups: &KvGroups,
    max_num_seqs: usize,
    max_model_len: usize,
    step: usize,
    bs: usize,
) -> usize {
    let each = groups.blocks_for(max_model_len.min(2048), step, bs);
    (max_num_seqs.max(1) * each).max(groups.blocks_for(max_model_len, step, bs))
}

/// The shape of one token's KV in one block: what the pool's bytes per block follow from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    /// Layers a block holds: every decoder layer, or the KV-cache groups' width.
    pub num_layers: usize,
    /// Key/value heads per layer.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// How each element is cached (`--kv-cache-dtype`: 4 bytes for f32, 2 for f16, 1 plus a 2-byte
    /// scale per head vector for q8_0).
    pub dtype: KvDType,
}

impl KvShape {
    /// Bytes of K and V for one token over all layers.
    pub fn bytes_per_token(&self) -> u64 {
        2 * (self.num_layers * self.num_kv_heads * self.dtype.vector_bytes(self.head_dim)) as u64
    }
}

/// What the pool is sized from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolSource {
    /// `--num-kv-blocks`: exactly this many.
    Blocks(usize),
    /// `--kv-cache-memory-bytes`: this many bytes of KV storage.
    KvBytes(u64),
    /// A memory limit for the whole process, and where it came from (for the log).
    MemoryLimit {
        /// The limit, bytes.
        bytes: u64,
        /// E.g. "the downward API (MODELFLEET_MEMORY_LIMIT_BYTES)" or "the cgroup (memory.max)".
        origin: String,
    },
    /// None of the above: [`default_pool_tokens`].
    Default,
}

/// What the rest of the process needs, subtracted from a memory limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Weight bytes as stored (what the engine keeps resident once loaded).
    pub weights: u64,
    /// The step buffers at `--max-num-batched-tokens` ([`crate::model::workspace_bytes`]).
    pub workspace: u64,
    /// A draft model's weights and the draft KV blocks its sequences need beyond the pool's tokens
    /// (0 without a draft model).
    pub draft: u64,
}

/// Everything the pool size depends on besides its source.
#[derive(Clone, Debug)]
pub struct PoolInputs {
    /// Per-token KV shape of a block.
    pub shape: KvShape,
    /// How the layers share blocks (one group of every layer for most models).
    pub groups: KvGroups,
    /// The most tokens one step computes (`--max-num-batched-tokens`): a window group holds its
    /// window and a step's tokens.
    pub step: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Weights and workspace.
    pub footprint: Footprint,
    /// The context limit in force: a memory-sized pool must hold one request this long.
    pub max_model_len: usize,
    /// `--max-num-seqs`, for the default pool.
    pub max_num_seqs: usize,
    /// A draft model's KV bytes per token (0 without one): its cache mirrors the pool's tokens.
    pub draft_bytes_per_token: u64,
}

/// The pool's size and how it was derived.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolPlan {
    /// KV blocks.
    pub blocks: usize,
    /// The longest request the blocks hold alone ([`KvGroups::tokens_fitting`]): `blocks ×
    /// block_size` unless window groups give blocks back.
    pub tokens: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Bytes of one block (K and V, all layers).
    pub bytes_per_block: u64,
    /// Bytes of the draft model's block mirroring each one (0 without a draft model).
    pub draft_bytes_per_block: u64,
    /// The source and the numbers in between.
    pub derivation: Derivation,
}

/// The numbers behind a [`PoolPlan`], for the log and `plan`.
#[derive(Clone, Debug, PartialEq)]
pub enum Derivation {
    /// `--num-kv-blocks`.
    Blocks,
    /// `--kv-cache-memory-bytes`.
    KvBytes {
        /// The bytes given.
        bytes: u64,
    },
    /// A memory limit.
    MemoryLimit {
        /// The limit.
        limit: u64,
        /// Where it came from.
        origin: String,
        /// Weights and workspace.
        footprint: Footprint,
        /// [`headroom`] of the limit.
        headroom: u64,
        /// What is left for the pool.
        pool_bytes: u64,
    },
    /// The default.
    Default {
        /// Tokens the default asks for.
        tokens: usize,
    },
}

impl PoolPlan {
    /// Tokens the pool holds.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Bytes of KV storage the pool allocates.
    pub fn bytes(&self) -> u64 {
        self.blocks as u64 * self.bytes_per_block
    }
}

impl fmt::Display for PoolPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / MIB);
        let tail = format!(
            "{} blocks of {} tokens ({} tokens, {} bytes per block, {} of KV)",
            self.blocks,
            self.block_size,
            self.tokens(),
            self.bytes_per_block,
            mib(self.bytes())
        );
        let per_block = match self.draft_bytes_per_block {
            0 => format!("{} bytes per block", self.bytes_per_block),
            d => format!(
                "({} + {d} for the draft model) bytes per block",
                self.bytes_per_block
            ),
        };
        let draft = match &self.derivation {
            Derivation::MemoryLimit { footprint, .. } if footprint.draft > 0 => {
                format!(" - draft model {} ({})", footprint.draft, mib(footprint.draft))
            }
            _ => String::new(),
        };
        match &self.derivation {
            Derivation::Blocks => write!(f, "KV pool: --num-kv-blocks: {tail}"),
            Derivation::KvBytes { bytes } => write!(
                f,
                "KV pool: --kv-cache-memory-bytes {bytes} ({}) / {per_block} = {tail}",
                mib(*bytes),
            ),
            Derivation::MemoryLimit {
                limit,
                origin,
                footprint,
                headroom,
                pool_bytes,
            } => write!(
                f,
                "KV pool: memory limit {limit} ({}, from {origin}) - weights {} ({}) - workspace {} ({}){draft} - \
                 headroom {} ({}) = {pool_bytes} ({}) / {per_block} = {tail}",
                mib(*limit),
                footprint.weights,
                mib(footprint.weights),
                footprint.workspace,
                mib(footprint.workspace),
                headroom,
                mib(*headroom),
                mib(*pool_bytes),
            ),
            Derivation::Default { tokens } => write!(
                f,
                "KV pool: no memory limit found (no --kv-cache-memory-bytes, --memory-limit-bytes or cgroup \
                 limit): the default of {tokens} tokens = {tail}"
            ),
        }
    }
}

/// Sizes the pool from `source` (see the module header): [`derive_pool`], then a memory-sized pool
/// must hold one request of `max_model_len` tokens.
pub fn plan_pool(source: &PoolSource, inputs: &PoolInputs) -> Result<PoolPlan> {
    let out = derive_pool(source, inputs);
    let needed = inputs
        .groups
        .blocks_for(inputs.max_model_len, inputs.step, out.block_size);
    let sized_from_memory = matches!(source, PoolSource::KvBytes(_) | PoolSource::MemoryLimit { .. });
    if sized_from_memory && out.blocks < needed {
        let field = match source {
            PoolSource::KvBytes(_) => "kv_cache_memory_bytes",
            _ => "memory_limit_bytes",
        };
        return Err(EngineError::InvalidParam {
            field,
            message: format!(
                "the KV pool cannot hold one request of --max-model-len {} tokens: that needs {needed} blocks \
                 ({} bytes), but {out}; raise the memory limit, lower --max-model-len, or use \
                 --kv-cache-dtype float16",
                inputs.max_model_len,
                needed as u64 * out.bytes_per_block,
            ),
        });
    }
    Ok(out)
}

/// The pool `source` gives, without the one-context check (`plan` reports pools that do not fit).
pub fn derive_pool(source: &PoolSource, inputs: &PoolInputs) -> PoolPlan {
    let bs = inputs.block_size.max(1);
    let bytes_per_block = inputs.shape.bytes_per_token() * bs as u64;
    let draft_bytes_per_block = inputs.draft_bytes_per_token * bs as u64;
    let plan = |blocks: usize, derivation| PoolPlan {
        blocks,
        tokens: inputs
            .groups
            .tokens_fitting(blocks, inputs.step, bs)
            .min(blocks * bs),
        block_size: bs,
        bytes_per_block,
        draft_bytes_per_block,
        derivation,
    };
    let by_bytes = |bytes: u64| (bytes / (bytes_per_block + draft_bytes_per_block).max(1)) as usize;
    match source {
        PoolSource::Blocks(n) => plan(*n, Derivation::Blocks),
        PoolSource::Default => {
            let tokens = default_pool_tokens(inputs.max_num_seqs, inputs.max_model_len);
            let (seqs, len) = (inputs.max_num_seqs, inputs.max_model_len);
            let blocks = default_pool_blocks(&inputs.groups, seqs, len, inputs.step, bs);
            plan(blocks, Derivation::Default { tokens })
        }
        PoolSource::KvBytes(bytes) => plan(by_bytes(*bytes), Derivation::KvBytes { bytes: *bytes }),
        PoolSource::MemoryLimit { bytes, origin } => {
            let f = inputs.footprint;
            let headroom = headroom(*bytes);
            let pool_bytes = bytes.saturating_sub(f.weights + f.workspace + f.draft + headroom);
            plan(
                by_bytes(pool_bytes),
                Derivation::MemoryLimit {
                    limit: *bytes,
                    origin: origin.clone(),
                    footprint: f,
                    headroom,
                    pool_bytes,
                },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of docs/capacity.md: 80 layers, 8 KV heads, head dim 128, 2-byte elements.
    const LLAMA_70B: KvShape = KvShape {
        num_layers: 80,
        num_kv_heads: 8,
        head_dim: 128,
        dtype: KvDType::F16,
    };

    fn inputs(footprint: Footprint, max_model_len: usize) -> PoolInputs {
        PoolInputs {
            shape: KvShape {
                num_layers: 2,
                num_kv_heads: 2,
                head_dim: 16,
                dtype: KvDType::F32,
            },
            groups: KvGroups::uniform(2),
            step: 512,
            block_size: 16,
            footprint,
            max_model_len,
            max_num_seqs: 4,
            draft_bytes_per_token: 0,
        }
    }

    #[test]
    fn bytes_per_token_of_the_worked_example() {
        assert_eq!(LLAMA_70B.bytes_per_token(), 320 * 1024);
        assert_eq!(LLAMA_70B.bytes_per_token() * 8192, 5 << 29); // 2.5 GiB
    }

    #[test]
    fn headroom_is_fixed_plus_a_share() {
        assert_eq!(headroom(0), 64 << 20);
        assert_eq!(headroom(1 << 30), (64 << 20) + (1 << 30) / 100 * 5);
    }

    #[test]
    fn sources() {
        let fp = Footprint {
            weights: 1_000_000,
            workspace: 200_000,
            draft: 0,
        };
        let i = inputs(fp, 256);
        // 512 bytes per token, 8192 per block.
        let check = |source: PoolSource, blocks: usize| {
            let p = plan_pool(&source, &i).unwrap();
            assert_eq!((p.blocks, p.bytes_per_block), (blocks, 8192), "{source:?}: {p}");
        };
        check(PoolSource::Blocks(3), 3);
        check(PoolSource::Default, 4 * 256 / 16);
        check(PoolSource::KvBytes(8192 * 20 + 100), 20);
        let limit = 200 << 20;
        let expected = (limit - 1_200_000 - headroom(limit)) / 8192;
        check(
            PoolSource::MemoryLimit {
                bytes: limit,
                origin: "test".into(),
            },
            expected as usize,
        );
        // The default holds at least one context, and at most max_num_seqs sequences of 2,048 tokens.
        assert_eq!(default_pool_tokens(4, 8192), 8192);
        assert_eq!(default_pool_tokens(64, 4096), 64 * 2048);
        assert_eq!(default_pool_tokens(0, 100), 100);
    }

    #[test]
    fn a_draft_model_shares_the_budget() {
        let fp = Footprint {
            weights: 1_000_000,
            workspace: 200_000,
            draft: 300_000,
        };
        // The pool's 512 bytes per token, the draft's 128: 8192 + 2048 bytes per block.
        let i = PoolInputs {
            draft_bytes_per_token: 128,
            ..inputs(fp, 256)
        };
        let limit = 200 << 20;
        let p = plan_pool(
            &PoolSource::MemoryLimit {
                bytes: limit,
                origin: "test".into(),
            },
            &i,
        )
        .unwrap();
        assert_eq!(
            p.blocks as u64,
            (limit - 1_500_000 - headroom(limit)) / (8192 + 2048)
        );
        assert_eq!(p.draft_bytes_per_block, 2048);
        let text = p.to_string();
        assert!(
            text.contains("draft model 300000") && text.contains("(8192 + 2048 for the draft model)"),
            "{text}"
        );
        let p = plan_pool(&PoolSource::KvBytes(10240 * 30 + 5), &i).unwrap();
        assert_eq!(p.blocks, 30);
        assert_eq!(plan_pool(&PoolSource::Blocks(7), &i).unwrap().blocks, 7);
    }

    #[test]
    fn a_pool_shorter_than_one_context_fails_naming_the_numbers() {
        let i = inputs(
            Footprint {
                weights: 1 << 20,
                workspace: 1 << 20,
                draft: 0,
            },
            2048,
        );
        // 2,048 tokens need 128 blocks = 1 MiB; a limit that leaves about 100 blocks after the
        // footprint and the headroom (limit - 2 MiB - 64 MiB - 5% of the limit = 100 blocks).
        let limit: u64 = ((66 << 20) + 100 * 8192) * 100 / 95 + 100;
        let err = plan_pool(
            &PoolSource::MemoryLimit {
                bytes: limit,
                origin: "the downward API".into(),
            },
            &i,
        )
        .unwrap_err()
        .to_string();
        for part in [
            "memory_limit_bytes",
            "2048 tokens",
            "128 blocks",
            "the downward API",
            "weights 1048576",
        ] {
            assert!(err.contains(part), "{part:?} missing from: {err}");
        }
        let err = plan_pool(&PoolSource::KvBytes(8192 * 127), &i)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kv_cache_memory_bytes") && err.contains("127 blocks"),
            "{err}"
        );
        assert!(plan_pool(&PoolSource::KvBytes(8192 * 128), &i).is_ok());
        // An explicit block count is the operator's choice, even below one context.
        assert_eq!(plan_pool(&PoolSource::Blocks(8), &i).unwrap().blocks, 8);
        // A limit below the footprint leaves nothing, and says so.
        let err = plan_pool(
            &PoolSource::MemoryLimit {
                bytes: 1 << 20,
                origin: "x".into(),
            },
            &i,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("= 0 (0.0 MiB)") && err.contains("0 blocks"), "{err}");
    }
}
