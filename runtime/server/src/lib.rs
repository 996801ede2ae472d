//! The `modelfleet-runtime` binary's library: everything the runtime pod does around the engine.
//!
//! - [`api`]: the `modelfleet-api` crate (shared with the gateway): OpenAI request parsing (unknown and
//!   unsupported fields refused by name), response bodies, the error mapping, metric names.
//! - [`digest`]: the canonical content digest of a model or adapter (docs/design.md, "Canonical digest");
//!   the engine's, re-exported.
//! - [`fetch`]: download or copy an artifact, verify its digest (and signature), then put it in place
//!   (init container); one module per source scheme behind one seam.
//! - [`fetch_cmd`]: the `fetch` command line.
//! - [`package`]: `package`, a model pushed to an OCI registry as a ModelPack artifact or a model image.
//! - [`metrics`]: the runtime's Prometheus metrics (docs/design.md names) and their vLLM aliases.
//! - [`tenants`]: API keys → tenant ids from the tenants file, reloaded on change (Secret rotation);
//!   also from `modelfleet-api`.
//! - [`logging`]: `tracing` to stderr and the usage records on stdout; a closed pipe never panics.
//! - [`gen_model`]: `gen-model`, random-weight Llama-family models of real shapes in Hugging Face layout
//!   (the command line; the generator is `modelfleet-testkit`'s).
//!
//! - [`serve`]: `serve`, the OpenAI-compatible server around the engine, and its admin listener.
//! - [`plan`]: `plan`, the memory arithmetic of a model (weights, KV per token and request, FLOPs, the
//!   KV pool a memory size buys), with the same sizing code as `serve`.
//!
//! - [`gen_adapter`]: `gen-adapter`, random PEFT LoRA adapters for a base model (the command line; the
//!   generator is `modelfleet-testkit`'s).
//! - [`adapters`]: multi-LoRA's registry (names, generations, tenants, residency), source policy,
//!   start-up list and per-adapter metrics.

pub mod adapters;
pub use modelfleet_api as api;
pub use modelfleet_engine::digest;
pub mod fetch;
pub mod fetch_cmd;
pub mod gen_adapter;
pub mod gen_model;
pub mod logging;
pub mod metrics;
pub mod package;
pub mod plan;
pub mod serve;
pub use modelfleet_api::tenants;
