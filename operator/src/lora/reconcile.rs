//! One pass for one LoraAdapter: the finalizer step, then `apply` (load onto every ready pod) or
//! `cleanup` (unload from every running pod, then release the finalizer).
//!
//! A pass observes through the Kubernetes API only (the base, the sibling adapters, the pods, the
//! admin token) and never waits on a pod: admin calls run as tasks ([`super::ops`]) whose endings wake
//! the adapter again. Status is written only when it changed.

use super::Context;
use super::admin::AdminToken;
use super::desired::{self, PodTarget, conflict, owner_of, pod_targets, references, served_name};
use super::events;
use super::finalizer::{self, Step};
use super::ops::{Call, Key, Kind, Progress, RESYNC, Want};
use super::status::{self, Observed, PodLoad};
use crate::Error;
use crate::builders::secret::existing_token;
use crate::labels::{FIELD_MANAGER, admin_secret_name, selector_string};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use modelfleet_crds::{LoraAdapter, ModelDeployment};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often an adapter that lost a served-name conflict looks again (the owner may go away).
pub const CONFLICT_RECHECK: Duration = Duration::from_secs(30);

/// What a pass observed through the API.
struct World {
    /// The base ModelDeployment.
    md: Option<ModelDeployment>,
    /// Every adapter of the same deployment (including this one).
    siblings: Vec<LoraAdapter>,
    /// Its pods with a running runtime, sorted by name.
    pods: Vec<PodTarget>,
    /// The admin token.
    token: Option<AdminToken>,
}

impl World {
    /// The base model's served name.
    fn base_name(&self) -> Option<String> {
        self.md.as_ref().map(crate::builders::deployment::served_name)
    }
}

async fn observe(a: &LoraAdapter, ctx: &Context, ns: &str) -> Result<World, Error> {
    let md_name = &a.spec.model_deployment_ref.name;
    let client = ctx.client.clone();
    let md = Api::<ModelDeployment>::namespaced(client.clone(), ns)
        .get_opt(md_name)
        .await?;
    let mut siblings: Vec<LoraAdapter> = Api::<LoraAdapter>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| references(s, ns, md_name) && s.uid() != a.uid())
        .collect();
    siblings.push(a.clone());
    if md.is_none() {
        return Ok(World {
            md,
            siblings,
            pods: Vec::new(),
            token: None,
        });
    }
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector_string(md_name)))
        .await?
        .items;
    let token = Api::<Secret>::namespaced(client, ns)
        .get_opt(&admin_secret_name(md_name))
        .await?
        .as_ref()
        .and_then(existing_token)
        .map(AdminToken::new);
    Ok(World {
        md,
        siblings,
        pods: pod_targets(&pods),
        token,
    })
}

/// One pass for one LoraAdapter.
pub async fn reconcile(a: Arc<LoraAdapter>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.duration.start_timer();
    ctx.metrics.reconciliations.inc();
    let ns = a
        .namespace()
        .ok_or_else(|| Error::Invalid("LoraAdapter without a namespace".into()))?;
    let api: Api<LoraAdapter> = Api::namespaced(ctx.client.clone(), &ns);
    let action = match finalizer::step(&a) {
        Step::Untracked => Action::await_change(),
        Step::Cleanup => cleanup(&a, &ctx, &api, &ns).await?,
        Step::Add => {
            finalizer::add(&api, &a).await?;
            apply(&a, &ctx, &api, &ns).await?
        }
        Step::Apply => apply(&a, &ctx, &api, &ns).await?,
    };
    ctx.succeeded(&a);
    Ok(action)
}

fn load_of(progress: Progress) -> PodLoad {
    match progress {
        Progress::InFlight => PodLoad::InFlight,
        Progress::Succeeded => PodLoad::Loaded,
        Progress::Failed { error, .. } => PodLoad::Failed(error),
    }
}

fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

/// The served name a pod still has from before a rename, when no adapter of the deployment owns it.
fn renamed_from(ctx: &Context, key: &Key, name: &str, siblings: &[LoraAdapter]) -> Option<String> {
    let ops = ctx.runner.ops.lock().unwrap();
    let old = &ops.get(key)?.want.entry.name;
    (old != name && owner_of(siblings, old).is_none()).then(|| old.clone())
}

fn call(ctx: &Context, a: &LoraAdapter, pod: &PodTarget, kind: Kind, token: &AdminToken) -> Call {
    Call {
        key: Key {
            adapter: a.uid().unwrap_or_default(),
            pod: pod.uid.clone(),
        },
        want: Want {
            kind,
            entry: desired::entry(a),
            restarts: pod.restarts,
        },
        base: ctx.runner.base_url(&pod.ip),
        token: token.clone(),
        unload_first: None,
        adapter: ObjectRef::from_obj(a),
    }
}

async fn apply(a: &LoraAdapter, ctx: &Context, api: &Api<LoraAdapter>, ns: &str) -> Result<Action, Error> {
    let world = observe(a, ctx, ns).await?;
    let uid = a.uid().unwrap_or_default();
    let conflict = conflict(a, &world.siblings, world.base_name().as_deref());
    let now = Instant::now();
    let mut pods = Vec::new();
    let mut look_again = None;
    match (&world.md, &conflict, &world.token) {
        (Some(_), None, Some(token)) => {
            let ready: Vec<&PodTarget> = world.pods.iter().filter(|p| p.ready).collect();
            for pod in &ready {
                let mut c = call(ctx, a, pod, Kind::Load, token);
                c.unload_first = renamed_from(ctx, &c.key, &c.want.entry.name, &world.siblings);
                look_again = earliest(look_again, ctx.runner.ensure(c.clone(), now));
                let progress = ctx.runner.ops.lock().unwrap().progress(&c.key, &c.want);
                pods.push((pod.name.clone(), load_of(progress)));
            }
            let keep: HashSet<&str> = ready.iter().map(|p| p.uid.as_str()).collect();
            ctx.runner.ops.lock().unwrap().retain(&uid, |p| keep.contains(p));
        }
        (Some(_), None, None) => {
            pods = world
                .pods
                .iter()
                .filter(|p| p.ready)
                .map(|p| (p.name.clone(), PodLoad::InFlight))
                .collect();
        }
        // A conflict or no base: nothing to load, and what was loaded belongs to someone else now.
        _ => ctx.runner.ops.lock().unwrap().forget(&uid),
    }
    let observed = Observed {
        generation: a.metadata.generation.unwrap_or(0),
        deployment: a.spec.model_deployment_ref.name.clone(),
        digest: a.spec.digest.clone(),
        base_found: world.md.is_some(),
        conflict,
        token_missing: world.md.is_some() && world.token.is_none(),
        deleting: false,
        pods,
    };
    write_status(a, ctx, api, &observed).await?;
    let wait = if observed.conflict.is_some() {
        CONFLICT_RECHECK
    } else {
        look_again.unwrap_or(RESYNC).min(RESYNC)
    };
    Ok(Action::requeue(wait))
}

async fn cleanup(a: &LoraAdapter, ctx: &Context, api: &Api<LoraAdapter>, ns: &str) -> Result<Action, Error> {
    let world = observe(a, ctx, ns).await?;
    let uid = a.uid().unwrap_or_default();
    // Only the owner of a served name unloads it: a conflicting adapter never loaded it.
    let owner = world.md.is_some() && conflict(a, &world.siblings, world.base_name().as_deref()).is_none();
    let now = Instant::now();
    let mut pending = Vec::new();
    let mut gave_up = Vec::new();
    let mut unloaded = 0;
    let mut look_again = None;
    if let (true, Some(token)) = (owner, &world.token) {
        for pod in &world.pods {
            let c = call(ctx, a, pod, Kind::Unload, token);
            look_again = earliest(look_again, ctx.runner.ensure(c.clone(), now));
            match ctx.runner.ops.lock().unwrap().progress(&c.key, &c.want) {
                Progress::InFlight => pending.push((pod.name.clone(), PodLoad::Unloading(None))),
                Progress::Succeeded => unloaded += 1,
                Progress::Failed {
                    error,
                    settled: false,
                } => pending.push((pod.name.clone(), PodLoad::Unloading(Some(error.message)))),
                Progress::Failed { error, settled: true } => gave_up.push((pod.name.clone(), error.message)),
            }
        }
        let keep: HashSet<&str> = world.pods.iter().map(|p| p.uid.as_str()).collect();
        ctx.runner.ops.lock().unwrap().retain(&uid, |p| keep.contains(p));
    }
    if pending.is_empty() {
        let mut notes: Vec<events::Note> = gave_up
            .iter()
            .map(|(pod, message)| (true, "UnloadFailed".to_string(), format!("pod {pod}: {message}")))
            .collect();
        if unloaded > 0 {
            notes.push((false, "Unloaded".into(), format!("unloaded from {unloaded} pods")));
        }
        events::publish(&ctx.recorder, a, notes).await;
        ctx.runner.ops.lock().unwrap().forget(&uid);
        finalizer::remove(api, a).await?;
        // An adapter that waited for this served name may take it now.
        let name = served_name(a);
        for s in world
            .siblings
            .iter()
            .filter(|s| s.uid() != a.uid() && served_name(s) == name)
        {
            let _ = ctx.runner.wake.unbounded_send(ObjectRef::from_obj(s));
        }
        return Ok(Action::await_change());
    }
    let mut pods = pending;
    pods.extend(gave_up.into_iter().map(|(p, m)| (p, PodLoad::UnloadFailed(m))));
    pods.sort_by(|x, y| x.0.cmp(&y.0));
    let observed = Observed {
        generation: a.metadata.generation.unwrap_or(0),
        deployment: a.spec.model_deployment_ref.name.clone(),
        digest: a.spec.digest.clone(),
        base_found: world.md.is_some(),
        conflict: None,
        token_missing: false,
        deleting: true,
        pods,
    };
    write_status(a, ctx, api, &observed).await?;
    Ok(Action::requeue(look_again.unwrap_or(Duration::from_secs(30))))
}

async fn write_status(
    a: &LoraAdapter,
    ctx: &Context,
    api: &Api<LoraAdapter>,
    observed: &Observed,
) -> Result<(), Error> {
    let previous = a.status.clone().unwrap_or_default();
    let next = status::build(observed, &previous, Timestamp::now());
    if a.status.as_ref() == Some(&next) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": "modelfleet.io/v1alpha1",
        "kind": "LoraAdapter",
        "status": next,
    });
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(&a.name_any(), &pp, &Patch::Apply(&patch))
        .await?;
    ctx.metrics.adapter_status_writes.inc();
    let notes = events::transitions(&previous.conditions, &next.conditions);
    events::publish(&ctx.recorder, a, notes).await;
    Ok(())
}

#[cfg(test)]
mod tests;
