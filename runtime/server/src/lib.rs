//! The `modelfleet-runtime` binary's library: everything the runtime pod does around the engine.
//!
//! - [`api`]: OpenAI request parsing (unknown and unsupported fields refused by name) and error mapping.
//! - [`digest`]: the canonical content digest of a model or adapter (DESIGN.md, "Canonical digest").
//! - [`fetch`]: download or copy an artifact, verify its digest, then put it in place (init container).
//! - [`fetch_cmd`]: the `fetch` command line.
//! - [`metrics`]: the runtime's Prometheus metrics (DESIGN.md names) and their vLLM aliases.
//! - [`tenants`]: API keys → tenant ids from the tenants file, reloaded on change (Secret rotation).
//!
//! The OpenAI-compatible server (`serve`), `gen-model` and `gen-adapter` arrive with the runtime, engine
//! and LoRA issues.

pub mod api;
pub mod digest;
pub mod fetch;
pub mod fetch_cmd;
pub mod metrics;
pub mod tenants;
