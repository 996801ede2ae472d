//! Multi-LoRA on the server side: the adapter registry (names, generations, tenants, residency), the
//! policy on where adapters may come from, the start-up list, and the per-adapter metrics. The admin
//! API (`serve::admin`) and the request path (`serve::openai`) call into it; the engine applies the
//! weights a request carries (`modelfleet_engine::model::lora`).

pub mod metrics;
pub mod registry;
pub mod spec;
pub mod startup;

pub use metrics::LoraMetrics;
pub use registry::{AdapterInfo, ModelChoice, Registry, RegistryConfig};
pub use spec::{AdapterSpec, UriPolicy};

#[cfg(test)]
mod tests;
