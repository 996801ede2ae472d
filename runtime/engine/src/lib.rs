//! The modelfleet inference engine: model loading, the Llama-family forward pass over a ragged batch
//! with a paged KV cache, tokenization and chat templates, sampling and stopping. No HTTP, no serde wire
//! types, no I/O beyond reading model and adapter directories (to load them, or to hash them:
//! [`digest`]) — `runtime/server` is the crate that talks to the network, and the scheduler (Engine II)
//! drives what is here.
//!
//! Tour (in the order a request meets it):
//! - [`tokenizer`]: `tokenizer.json`, the Jinja chat template of `tokenizer_config.json`,
//!   `generation_config.json`, and incremental detokenization that never splits a UTF-8 character.
//! - [`kv`]: the paged KV cache in vLLM v1's layers — [`kv::KvCacheManager`] (block tables per request)
//!   over a [`kv::BlockPool`] (blocks), and the per-layer storage the model reads.
//! - [`model`]: `config.json`, memory-mapped safetensors or GGUF (f32/f16/bf16, Q4_0/Q4_1/Q8_0/Q4_K/
//!   Q6_K), and [`model::Decoder::forward`], one step over a batch of prefill chunks and decode
//!   tokens, on any [`modelfleet_kernels::Kernels`] backend.
//! - [`sampling`]: parameter validation, logits processors, greedy/seeded sampling with logprobs.
//! - [`constraint`]: structured output — JSON schema, regex, choice and Lark grammars compiled with
//!   llguidance over our tokenizer's token trie (cached per model), masks applied while decoding.
//! - [`speculative`]: speculative decoding — n-gram and draft-model proposers, the exact verifier, the
//!   gates that skip speculation when it does not pay.
//! - [`stop`]: stop conditions and the hold-back buffer for stop strings.
//! - [`sequence`]: one request's generation state (sampler RNG, penalties, stop checker, detokenizer)
//!   turning a row of logits into the next token and its text.
//! - [`ModelDir`]: everything in a Hugging Face model directory or GGUF file, loaded together.
//! - [`digest`]: the canonical content digest of a model or adapter directory (docs/design.md,
//!   "Canonical digest"), what an adapter's [`lora::AdapterIdentity`] carries and the runtime verifies
//!   fetched artifacts against.
//! - [`embed`]: embedding models — a BERT-family encoder, pooling and normalisation from the model's
//!   sentence-transformers files — for `/v1/embeddings`.
//! - [`Engine`]: what the scheduler's step loop owns — model, backend, KV storage — and `step`.
//!
//! Architecture invariants:
//! - Batch invariance: a request's logits, and so its sampled tokens for a given seed, are the same
//!   alone or in any batch (kernels reduce in a fixed per-row order; one RNG per request).
//! - One error type, [`EngineError`]; errors from files name the file and the field or tensor.
//! - Nothing here panics on bad input files or parameters.

pub mod constraint;
pub mod digest;
pub mod embed;
mod engine;
pub mod error;
pub mod kv;
pub mod lora;
pub mod model;
mod model_dir;
pub mod sampling;
pub mod sched;
pub mod sequence;
pub mod speculative;
pub mod stop;
pub mod tokenizer;

pub use engine::{Engine, EngineConfig};
pub use error::{EngineError, Result};
pub use model_dir::ModelDir;
/// The kernels crate, so callers name one dependency (`modelfleet_engine::kernels::cpu::CpuKernels`).
pub use modelfleet_kernels as kernels;
