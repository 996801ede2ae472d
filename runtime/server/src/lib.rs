//! The `modelfleet-runtime` binary's library: everything the runtime pod does around the engine.
//!
//! - [`digest`]: the canonical content digest of a model or adapter (DESIGN.md, "Canonical digest").
//!
//! The OpenAI-compatible server (`serve`), `fetch`, `gen-model` and `gen-adapter` arrive with the
//! runtime, engine and LoRA issues.

pub mod digest;
