//! The `modelfleet.io/lora-unload` finalizer: a LoraAdapter is unloaded from its deployment's pods
//! before it goes away.
//!
//! Invariants: which step a pass takes is a pure function of the object ([`step`]); finalizer patches
//! carry the object's `resourceVersion`, so a patch over a list that changed meanwhile fails (409) and
//! the pass is retried instead of dropping someone else's finalizer; cleanup itself never waits on a
//! pod (see `reconcile::cleanup`), so the finalizer cannot hang on a missing base, missing pods or a
//! pod that does not answer.

use crate::Error;
use crate::labels::LORA_FINALIZER;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use modelfleet_crds::LoraAdapter;
use serde_json::{Value, json};

/// What a pass does with an adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Live, without our finalizer: add it, then load.
    Add,
    /// Live, with our finalizer: load.
    Apply,
    /// Being deleted, with our finalizer: unload, then remove it.
    Cleanup,
    /// Being deleted without our finalizer (already cleaned up): nothing to do.
    Untracked,
}

/// The step for `a`.
pub fn step(a: &LoraAdapter) -> Step {
    let ours = a.finalizers().iter().any(|f| f == LORA_FINALIZER);
    match (a.metadata.deletion_timestamp.is_some(), ours) {
        (false, false) => Step::Add,
        (false, true) => Step::Apply,
        (true, true) => Step::Cleanup,
        (true, false) => Step::Untracked,
    }
}

/// The merge patch that adds (`add`) or removes our finalizer, keeping the others, guarded by the
/// object's `resourceVersion`.
pub fn patch(a: &LoraAdapter, add: bool) -> Value {
    let mut finalizers: Vec<String> = a
        .finalizers()
        .iter()
        .filter(|f| *f != LORA_FINALIZER)
        .cloned()
        .collect();
    if add {
        finalizers.push(LORA_FINALIZER.to_string());
    }
    json!({"metadata": {"finalizers": finalizers, "resourceVersion": a.resource_version()}})
}

async fn send(api: &Api<LoraAdapter>, a: &LoraAdapter, add: bool) -> Result<(), Error> {
    api.patch(
        &a.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch(a, add)),
    )
    .await?;
    Ok(())
}

/// Adds our finalizer.
pub async fn add(api: &Api<LoraAdapter>, a: &LoraAdapter) -> Result<(), Error> {
    send(api, a, true).await
}

/// Removes our finalizer (the API server then deletes the object if no other finalizer remains).
pub async fn remove(api: &Api<LoraAdapter>, a: &LoraAdapter) -> Result<(), Error> {
    send(api, a, false).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::desired::tests::adapter;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn with(finalizers: &[&str], deleting: bool) -> LoraAdapter {
        let mut a = adapter("sql", None, 0);
        a.metadata.resource_version = Some("42".into());
        a.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        if deleting {
            a.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        }
        a
    }

    #[test]
    fn steps() {
        let cases = [
            (with(&[], false), Step::Add),
            (with(&["other.io/keep"], false), Step::Add),
            (with(&[LORA_FINALIZER], false), Step::Apply),
            (with(&[LORA_FINALIZER, "other.io/keep"], true), Step::Cleanup),
            (with(&["other.io/keep"], true), Step::Untracked),
            (with(&[], true), Step::Untracked),
        ];
        for (a, expected) in cases {
            assert_eq!(step(&a), expected, "{:?}", a.metadata.finalizers);
        }
    }

    #[test]
    fn patches_keep_other_finalizers_and_are_guarded() {
        let a = with(&["other.io/keep"], false);
        assert_eq!(
            patch(&a, true),
            json!({"metadata": {"finalizers": ["other.io/keep", LORA_FINALIZER], "resourceVersion": "42"}})
        );
        let a = with(&["other.io/keep", LORA_FINALIZER], true);
        assert_eq!(
            patch(&a, false),
            json!({"metadata": {"finalizers": ["other.io/keep"], "resourceVersion": "42"}})
        );
        assert_eq!(
            patch(&with(&[LORA_FINALIZER], true), false),
            json!({"metadata": {"finalizers": [], "resourceVersion": "42"}})
        );
    }
}
