//! The modelfleet inference engine: scheduler, paged KV cache, prefix cache, sampling and the model
//! forward pass. No HTTP, no serde wire types, no I/O beyond loading weights — `runtime/server` is the
//! only crate that talks to the network.
//!
//! Empty until the engine issues (Engine I, Engine II) land; the crate exists so the workspace has the
//! layout of `DESIGN.md` from the start.
