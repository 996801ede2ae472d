//! Writing everything the operator owns for a ModelDeployment: the admin Secret is created once and
//! never written again (so the operator needs no right to patch Secrets, and never rotates the token by
//! accident); the rest is server-side applied under one field manager, the adapters ConfigMap before
//! the Deployment, so a pod never waits for its start-up list.
//!
//! Callers apply only after [`super::ownership::conflict`] found every existing object to be this
//! ModelDeployment's own.

use super::ownership::Existing;
use super::{Context, desired_objects};
use crate::Error;
use crate::builders::adapters::{AdapterSpec, desired_adapters_configmap};
use crate::builders::secret::{existing_token, new_token};
use crate::labels::{FIELD_MANAGER, adapters_configmap_name, admin_secret_name};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use modelfleet_crds::ModelDeployment;

/// Creates the admin Secret if missing, then applies the adapters ConfigMap listing `adapters`, the
/// Deployment with `replicas`, the Service and the PodDisruptionBudget. Returns the admin token.
pub async fn owned_objects(
    md: &ModelDeployment,
    ctx: &Context,
    existing: &Existing,
    replicas: i32,
    adapters: &[AdapterSpec],
) -> Result<String, Error> {
    let ns = md.namespace().unwrap_or_default();
    let name = md.name_any();
    let kept = existing.secret.as_ref().map(existing_token);
    let token = match &kept {
        Some(Some(token)) => token.clone(),
        Some(None) => {
            return Err(Error::Invalid(format!(
                "the admin Secret {:?} holds no usable token; delete it and the operator creates a new one",
                admin_secret_name(&name)
            )));
        }
        None => new_token(),
    };
    let (secret, deployment, service, pdb) = desired_objects(md, &ctx.cfg, replicas, &token);
    if kept.is_none() {
        Api::<Secret>::namespaced(ctx.client.clone(), &ns)
            .create(&PostParams::default(), &secret)
            .await?;
    }
    let pp = PatchParams::apply(FIELD_MANAGER).force();
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
    Ok(token)
}
