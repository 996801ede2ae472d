//! The built-in autoscaler, in one place: per-replica queue depth, running requests and KV-cache
//! utilisation in ([`metrics`], from pod scrapes or PromQL), a replica count out ([`decide`], pure
//! arithmetic with stabilization windows whose state lives in the ModelDeployment's status so it
//! survives restarts), the fleet gateway's demand ([`gateway`]) for scaling to and from zero
//! ([`zero`]), scale-ups held while a replica cannot be placed ([`hold`]), and the driver each
//! reconcile pass calls ([`driver::Autoscaler`]: sample → decide → record, rate-limited, with the
//! leader's memory of the windows).
//!
//! Invariants: the autoscaler never writes the user's spec — its decision is `status.desiredReplicas`;
//! missing or stale metrics never cause a scale-down; one step at most doubles the count.

pub mod cron;
pub mod decide;
pub mod driver;
pub mod gateway;
pub mod hold;
pub mod latency;
pub mod metrics;
pub mod objectives;
pub mod readings;
pub mod schedule;
pub mod sizing;
pub mod zero;

pub use driver::{AUTOSCALE_INTERVAL, Autoscaler, Scaled};
