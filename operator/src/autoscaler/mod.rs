//! The built-in autoscaler: per-replica queue depth, running requests and KV-cache utilisation in
//! ([`metrics`], from pod scrapes or PromQL), a replica count out ([`decide`], pure arithmetic with
//! stabilization windows whose state lives in the ModelDeployment's status so it survives restarts), and
//! the fleet gateway's demand ([`gateway`]) for scaling to and from zero (`controller/zero.rs`).
//!
//! Invariants: the autoscaler never writes the user's spec — its decision is `status.desiredReplicas`;
//! missing or stale metrics never cause a scale-down; one step at most doubles the count.

pub mod decide;
pub mod gateway;
pub mod metrics;
