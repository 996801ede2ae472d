//! The objects a ModelDeployment's pass would apply, as they exist now, and whether each is this
//! ModelDeployment's to change.
//!
//! Invariant: the operator never adopts an object it did not create. Before any server-side apply, each
//! same-named object that exists (the admin Secret, the adapters ConfigMap, the Deployment, the Service,
//! the PodDisruptionBudget) must name this ModelDeployment (by uid) as its controller; if one does not,
//! the pass applies nothing, and status says `Stalled=True`, reason `NameConflict`, naming the object.
//! A forced apply would otherwise take over fields of, say, a user's Secret of the same name.

use crate::labels::{adapters_configmap_name, admin_secret_name, workload_name};
use k8s_openapi::Resource as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::Api;
use modelfleet_crds::ModelDeployment;

/// The same-named objects the pass found.
#[derive(Clone, Debug, Default)]
pub struct Existing {
    /// `<md>-admin-token`.
    pub secret: Option<Secret>,
    /// `<md>-adapters`.
    pub configmap: Option<ConfigMap>,
    /// `<md>`.
    pub deployment: Option<Deployment>,
    /// `<md>`.
    pub service: Option<Service>,
    /// `<md>`.
    pub pdb: Option<PodDisruptionBudget>,
}

impl Existing {
    /// Reads them (one GET each).
    pub async fn read(client: &kube::Client, md: &ModelDeployment) -> Result<Existing, kube::Error> {
        let ns = md.namespace().unwrap_or_default();
        let name = md.name_any();
        Ok(Existing {
            secret: Api::namespaced(client.clone(), &ns)
                .get_opt(&admin_secret_name(&name))
                .await?,
            configmap: Api::namespaced(client.clone(), &ns)
                .get_opt(&adapters_configmap_name(&name))
                .await?,
            deployment: Api::namespaced(client.clone(), &ns)
                .get_opt(&workload_name(&name))
                .await?,
            service: Api::namespaced(client.clone(), &ns)
                .get_opt(&workload_name(&name))
                .await?,
            pdb: Api::namespaced(client.clone(), &ns)
                .get_opt(&workload_name(&name))
                .await?,
        })
    }
}

/// Whether `meta` names the object with `uid` as its controller.
pub fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

/// The first existing object `md` does not control, as the `NameConflict` message.
pub fn conflict(md: &ModelDeployment, existing: &Existing) -> Option<String> {
    let uid = md.metadata.uid.clone().unwrap_or_default();
    let check = |kind: &str, meta: Option<&ObjectMeta>| {
        let meta = meta?;
        (!controlled_by(meta, &uid)).then(|| {
            format!(
                "{kind} {:?} already exists and is not controlled by this ModelDeployment; rename or delete it \
                 (the operator changes nothing meanwhile)",
                meta.name.clone().unwrap_or_default()
            )
        })
    };
    check(Secret::KIND, existing.secret.as_ref().map(|o| &o.metadata))
        .or_else(|| check(ConfigMap::KIND, existing.configmap.as_ref().map(|o| &o.metadata)))
        .or_else(|| {
            check(
                Deployment::KIND,
                existing.deployment.as_ref().map(|o| &o.metadata),
            )
        })
        .or_else(|| check(Service::KIND, existing.service.as_ref().map(|o| &o.metadata)))
        .or_else(|| {
            check(
                PodDisruptionBudget::KIND,
                existing.pdb.as_ref().map(|o| &o.metadata),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::fixtures::minimal;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(name: &str, owner: Option<(&str, bool)>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            owner_references: owner.map(|(uid, controller)| {
                vec![OwnerReference {
                    api_version: "modelfleet.io/v1alpha1".into(),
                    kind: "ModelDeployment".into(),
                    name: "smollm2".into(),
                    uid: uid.into(),
                    controller: Some(controller),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_objects_this_model_deployment_controls_may_be_applied() {
        let md = minimal();
        let ours = md.metadata.uid.clone().unwrap();
        let secret = |owner| Secret {
            metadata: meta("smollm2-admin-token", owner),
            ..Default::default()
        };
        let with = |s: Secret| Existing {
            secret: Some(s),
            ..Default::default()
        };
        assert_eq!(conflict(&md, &Existing::default()), None, "nothing exists yet");
        assert_eq!(conflict(&md, &with(secret(Some((&ours, true))))), None);
        for foreign in [None, Some(("another-uid", true)), Some((ours.as_str(), false))] {
            let message = conflict(&md, &with(secret(foreign))).unwrap();
            assert!(
                message.starts_with("Secret \"smollm2-admin-token\" already exists"),
                "{message}"
            );
        }
        let service = Existing {
            service: Some(Service {
                metadata: meta("smollm2", None),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(
            conflict(&md, &service)
                .unwrap()
                .starts_with("Service \"smollm2\"")
        );
    }
}
