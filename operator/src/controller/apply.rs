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
use modelfleet_crds::rollout::RolloutStatus;

/// What the pass decided the runtime Deployments look like.
pub struct Shape<'a> {
    /// The replica count (split between stable and canary during a rollout).
    pub replicas: i32,
    /// The start-up adapter list.
    pub adapters: &'a [AdapterSpec],
    /// The new `status.rollout` (a canary strategy), which shapes the Deployments (rollout/plan.rs).
    pub rollout: Option<&'a RolloutStatus>,
}

/// Creates the admin Secret if missing, then applies the adapters ConfigMap, the Deployment (and
/// during a rollout the canary's, or deletes it), the Service and the PodDisruptionBudget. Returns the
/// admin token.
pub async fn owned_objects(
    md: &ModelDeployment,
    ctx: &Context,
    existing: &Existing,
    shape: &Shape<'_>,
) -> Result<String, Error> {
    let (replicas, adapters) = (shape.replicas, shape.adapters);
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
    let (secret, deployment, service, pdb) =
        desired_objects(md, &ctx.cfg, replicas, &token).map_err(|e| Error::Invalid(e.to_string()))?;
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
    deployments(md, ctx, existing, shape.rollout, deployment, replicas).await?;
    Api::<Service>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&service))
        .await?;
    Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&pdb))
        .await?;
    Ok(token)
}

/// Applies the runtime Deployment — with a canary strategy, the stable and canary Deployments of the
/// rollout's phase — and deletes a canary Deployment no longer wanted.
async fn deployments(
    md: &ModelDeployment,
    ctx: &Context,
    existing: &Existing,
    rollout: Option<&RolloutStatus>,
    mut desired: Deployment,
    replicas: i32,
) -> Result<(), Error> {
    let (ns, name) = (md.namespace().unwrap_or_default(), md.name_any());
    let api = Api::<Deployment>::namespaced(ctx.client.clone(), &ns);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let Some(status) = rollout else {
        api.patch(&name, &pp, &Patch::Apply(&desired)).await?;
        // A rollout that was in flight when the strategy went away leaves no canary behind.
        if md.status.as_ref().is_some_and(|s| s.rollout.is_some()) {
            delete_canary(&api, md).await?;
        }
        return Ok(());
    };
    crate::rollout::plan::label_revision(&mut desired);
    let plan = crate::rollout::plan::plan(&name, &desired, existing.deployment.as_ref(), status, replicas);
    api.patch(&name, &pp, &Patch::Apply(&plan.stable)).await?;
    match plan.canary {
        Some(c) => {
            let canary = crate::rollout::plan::canary_name(&name);
            if api.get_opt(&canary).await?.is_some_and(|d| !ours(md, &d)) {
                return Err(Error::Invalid(format!(
                    "the canary Deployment {canary:?} exists and is not controlled by this ModelDeployment \
                     (another ModelDeployment may be named {canary:?}): rename one of them"
                )));
            }
            api.patch(&canary, &pp, &Patch::Apply(&c)).await?;
        }
        // Only a rollout that had a canary can have left its Deployment behind.
        None if md
            .status
            .as_ref()
            .and_then(|s| s.rollout.as_ref())
            .is_some_and(|r| r.canary_revision.is_some()) =>
        {
            delete_canary(&api, md).await?
        }
        None => {}
    }
    Ok(())
}

fn ours(md: &ModelDeployment, d: &Deployment) -> bool {
    let uid = md.metadata.uid.as_deref().unwrap_or_default();
    super::ownership::controlled_by(&d.metadata, uid)
}

/// Deletes `<md>-canary` if it exists and this ModelDeployment controls it.
async fn delete_canary(api: &Api<Deployment>, md: &ModelDeployment) -> Result<(), Error> {
    let name = crate::rollout::plan::canary_name(&md.name_any());
    let Some(d) = api.get_opt(&name).await? else {
        return Ok(());
    };
    if !ours(md, &d) {
        return Ok(());
    }
    match api.delete(&name, &Default::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
