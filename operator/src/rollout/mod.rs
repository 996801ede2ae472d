//! Progressive delivery (`spec.rollout`): the revision a ModelDeployment's pods run, the canary walk
//! through weighted steps, and the analysis that judges each step (docs/rollouts.md).
//!
//! - `revision.rs`: a revision is the hash of the runtime pods' template — what changes pods.
//! - `analysis.rs` (pure): one window of the canary's traffic against stable's → wait, pass or fail.
//! - `walk.rs` (pure): the previous `status.rollout` and what is observed → the next one and its Event.
//! - `measure.rs`: per-revision traffic read from the gateway's pods, windows in the leader's memory.
//! - `plan.rs` (pure): the stable and canary Deployments a phase asks for.
//! - `drive.rs`: the pass's rollout step (observe, judge, walk).

pub mod analysis;
pub mod drive;
pub mod measure;
pub mod plan;
pub mod revision;
pub mod walk;

#[cfg(test)]
mod tests;
