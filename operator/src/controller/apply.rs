//! Server-side apply of everything the operator owns for a ModelDeployment, under one field manager.
//! The admin token is read back from the existing Secret so applying never rotates it; the adapters
//! ConfigMap is applied before the Deployment, so a pod never waits for its start-up list.

use super::{Context, desired_objects};
use crate::Error;
use crate::builders::adapters::{AdapterEntry, desired_adapters_configmap};
use crate::builders::secret::{existing_token, new_token};
use crate::labels::{FIELD_MANAGER, adapters_configmap_name, admin_secret_name};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use modelfleet_crds::ModelDeployment;

/// Applies the admin Secret, the adapters ConfigMap listing `adapters`, the Deployment with `replicas`,
/// the Service and the PodDisruptionBudget.
pub async fn owned_objects(
    md: &ModelDeployment,
    ctx: &Context,
    secrets: &Api<Secret>,
    replicas: i32,
    adapters: &[AdapterEntry],
) -> Result<(), Error> {
    let ns = md.namespace().unwrap_or_default();
    let name = md.name_any();
    let token = secrets
        .get_opt(&admin_secret_name(&name))
        .await?
        .as_ref()
        .and_then(existing_token)
        .unwrap_or_else(new_token);
    let (secret, deployment, service, pdb) = desired_objects(md, &ctx.cfg, replicas, &token);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    secrets
        .patch(&admin_secret_name(&name), &pp, &Patch::Apply(&secret))
        .await?;
    Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &adapters_configmap_name(&name),
            &pp,
            &Patch::Apply(&desired_adapters_configmap(md, adapters)),
        )
        .await?;
    Api::<Deployment>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&deployment))
        .await?;
    Api::<Service>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&service))
        .await?;
    Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&pdb))
        .await?;
    Ok(())
}
