//! Desired objects, built by pure functions from a ModelDeployment and the operator's settings. The
//! reconciler only applies what these return (server-side apply, one field manager, owned by the CR), so
//! everything the operator creates is unit-tested here without a cluster.

pub mod adapters;
pub mod deployment;
pub mod model_volume;
pub mod overlay;
pub mod pdb;
pub mod placement;
pub mod secret;
pub mod service;

pub use adapters::desired_adapters_configmap;
pub use deployment::desired_deployment;
pub use pdb::desired_pdb;
pub use secret::desired_admin_secret;
pub use service::desired_service;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use modelfleet_crds::ModelDeployment;

/// Metadata of an object owned (as controller) by `md`.
pub(crate) fn owned_meta(md: &ModelDeployment, name: String) -> ObjectMeta {
    let md_name = md.metadata.name.clone().unwrap_or_default();
    ObjectMeta {
        name: Some(name),
        namespace: md.metadata.namespace.clone(),
        labels: Some(crate::labels::labels(&md_name)),
        owner_references: md.controller_owner_ref(&()).map(|r: OwnerReference| vec![r]),
        ..ObjectMeta::default()
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    use modelfleet_crds::ModelDeployment;

    /// A ModelDeployment as the API server returns it (with uid and defaults), from YAML.
    pub fn md(spec_yaml: &str) -> ModelDeployment {
        let text = format!(
            "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: smollm2\n  \
             namespace: serving\n  uid: 6f1e0c39-0000-4000-8000-000000000001\n  generation: 3\nspec:\n{spec_yaml}"
        );
        serde_saphyr::from_str(&text).expect("fixture parses")
    }

    pub const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    pub fn minimal() -> ModelDeployment {
        md(&format!(
            "  model:\n    uri: file:///models/smollm2.gguf\n    digest: \"{DIGEST}\"\n"
        ))
    }
}
