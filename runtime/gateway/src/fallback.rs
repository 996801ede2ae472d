//! Fallbacks (`spec.fallback` of a ModelDeployment): when a deployment cannot start a request — no
//! Ready replica within `noReadyReplicaWaitSeconds` (`NoReadyReplica`), every pod tried refused it
//! for load or could not be reached (`Saturated`), or no first token within the first-token deadline
//! (`FirstTokenDeadline`: the pod gave the request up, or stayed silent and was cut) — the request
//! moves to the first target that takes that trigger, then the next, before the client has seen a
//! byte. On a target the deadline starts again, as long, while a later target takes it. A target may
//! also be an external OpenAI-compatible provider ([`crate::provider`]): the end of the line, whatever
//! it answers. A target is another ModelDeployment
//! in the same namespace; the request goes there as the caller's own: the body's `model` becomes the
//! target's served name, the caller's key must name the same tenant there (else the target is passed
//! over: no key grants more by a move), and the tenant's limits and prices of the target apply (a new
//! lease; the first is released unused). Every answer of a deployment with fallbacks names the
//! deployment that gave it (`x-modelfleet-served-by: namespace/name`).
//!
//! Invariants: a request moves only when no pod's handler may have started it (a connection reset is
//! never moved, as it is never retried twice), or when its pod gave it up or had its connection closed
//! at the first-token deadline (either way the pod cancels it: the client gets one answer); a move is one step down one list (a target's own
//! fallbacks are not followed, so lists cannot loop); adapters never move (they belong to their base);
//! the deployment the request was sent to counts each move as demand
//! (`modelfleet_gateway_fallbacks_total`), so a deployment at zero still scales up while its fallback
//! answers; the wait for a Ready replica is cut short only when a target is there to take the request.

use crate::edge::Authorized;
use crate::fleet::{Deployment, DeploymentId};
use crate::limits::Who;
use crate::limits::headers::RateHeaders;
use crate::provider::Provider;
use crate::proxy::{Job, attempt};
use crate::refusal::Refused;
use crate::state::Gateway;
use axum::http::HeaderValue;
use axum::response::Response;
use bytes::Bytes;
use modelfleet_crds::{FallbackSpec, FallbackTarget, FallbackTrigger};
use std::sync::Arc;
use std::time::Duration;

/// Response header naming the deployment that answered (`namespace/name`).
pub const SERVED_BY_HEADER: &str = "x-modelfleet-served-by";

/// Forwards `job`, whose deployment has fallbacks `spec`.
pub async fn forward(gw: Arc<Gateway>, job: Job, spec: &FallbackSpec) -> Response {
    let origin = job.auth.deployment.id.clone();
    let key = crate::routes::key_of(&job.headers).map(str::to_owned);
    let targets: Vec<Target> = {
        let fleet = gw.fleet.borrow();
        spec.targets
            .iter()
            .map(|t| Target::resolve(&fleet.deployments, &origin, &job, key.as_deref(), t))
            .collect()
    };
    let wait = Duration::from_secs(spec.no_ready_replica_wait_seconds.max(0) as u64);
    let waits = |from: usize| {
        let takes = targets[from..]
            .iter()
            .any(|t| t.usable() && t.spec.takes(FallbackTrigger::NoReadyReplica));
        takes.then_some(wait)
    };
    // A target's first-token deadline (as long as the first one) runs while a later target takes it.
    let within = job
        .first_token_by
        .map(|by| by.saturating_duration_since(job.arrival));
    let rearm = |from: usize| {
        let takes = targets[from..]
            .iter()
            .any(|t| t.usable() && t.spec.takes(FallbackTrigger::FirstTokenDeadline));
        within.filter(|_| takes).map(|w| tokio::time::Instant::now() + w)
    };
    let mut outcome = attempt(&gw, job, waits(0))
        .await
        .map(|resp| served_by(resp, &origin));
    let mut next = 0;
    // The rate-limit headers of the lease the request is under after a move (the caller's limits
    // at the target, which is what the request was charged to).
    let mut rate: Option<RateHeaders> = None;
    loop {
        let refused = match outcome {
            Ok(resp) => return rated(resp, rate),
            Err(refused) => refused,
        };
        let trigger = refused.refusal.trigger;
        let Some(i) = (next..targets.len()).find(|&i| targets[i].spec.takes(trigger)) else {
            return rated(answer(&gw, *refused), rate);
        };
        next = i + 1;
        let target = &targets[i];
        let moved = match target.take(&gw, *refused, &origin, trigger).await {
            Ok(Moved::Deployment(mut job, id)) => {
                job.first_token_by = rearm(next);
                rate = Some(job.lease.headers.clone());
                (job, id)
            }
            Ok(Moved::Provider(job, provider)) => {
                let moved_rate = Some(job.lease.headers.clone());
                return rated(crate::provider::forward(job, provider, &origin).await, moved_rate);
            }
            Err(refused) => {
                outcome = Err(refused);
                continue;
            }
        };
        let (job, id) = moved;
        outcome = attempt(&gw, job, waits(next))
            .await
            .map(|resp| served_by(resp, &id));
    }
}

/// Marks an answer whose rate-limit headers are those of the lease it was served under after a move
/// (the edge then leaves them as they are).
#[derive(Clone, Copy, Debug)]
pub struct Rated;

/// `resp` with the moved request's rate-limit headers, if it moved.
fn rated(mut resp: Response, rate: Option<RateHeaders>) -> Response {
    if let Some(rate) = rate {
        rate.apply(resp.headers_mut());
        resp.extensions_mut().insert(Rated);
    }
    resp
}

/// The answer of the last deployment that refused, naming it.
fn answer(gw: &Gateway, refused: Refused) -> Response {
    let Refused { refusal, mut job } = refused;
    let id = job.auth.deployment.id.clone();
    served_by(refusal.answer(gw, &mut job.record), &id)
}

fn served_by(mut resp: Response, id: &DeploymentId) -> Response {
    if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
        resp.headers_mut().insert(SERVED_BY_HEADER, v);
    }
    resp
}

/// A fallback target as this request sees it.
struct Target<'a> {
    spec: &'a FallbackTarget,
    /// Its name in the metric: the deployment's name, or `provider:<name>`.
    label: String,
    /// Where the request would go, or why it cannot go there.
    found: Result<Place, &'static str>,
}

/// Where a target sends a request.
enum Place {
    /// A deployment, and the caller's tenant in it.
    Deployment(Arc<Deployment>, Arc<modelfleet_api::tenants::Tenant>),
    /// A provider (the caller's tenant stays the one of the deployment the request was sent to).
    Provider(Arc<Provider>),
}

/// A moved request, and where it goes now.
enum Moved {
    Deployment(Job, DeploymentId),
    Provider(Job, Arc<Provider>),
}

impl<'a> Target<'a> {
    fn resolve(
        deployments: &std::collections::BTreeMap<DeploymentId, Arc<Deployment>>,
        origin: &DeploymentId,
        job: &Job,
        key: Option<&str>,
        spec: &'a FallbackTarget,
    ) -> Target<'a> {
        if let Some(p) = &spec.provider {
            let found = match job.auth.deployment.providers.get(&p.name) {
                None => Err("no_provider"),
                Some(p) if p.key.is_err() => Err("no_key"),
                Some(p) => Ok(Place::Provider(p.clone())),
            };
            let label = format!("provider:{}", p.name);
            return Target { spec, label, found };
        }
        let name = spec.model_deployment.clone().unwrap_or_default();
        let id = DeploymentId {
            namespace: origin.namespace.clone(),
            name,
        };
        let found = match deployments.get(&id) {
            None => Err("no_deployment"),
            Some(_) if id == *origin => Err("no_deployment"),
            Some(d) => match d.tenant(key) {
                Ok(Some(t)) if t.id == job.auth.tenant.id => Ok(Place::Deployment(d.clone(), t)),
                _ => Err("other_tenant"),
            },
        };
        Target {
            spec,
            label: id.name,
            found,
        }
    }

    fn usable(&self) -> bool {
        self.found.is_ok()
    }

    /// Moves the request here: the target's name in the body, its tenant limits (a new lease; the
    /// old one is released unused), its accounting. `Err` gives the request back, still refused.
    async fn take(
        &self,
        gw: &Gateway,
        refused: Refused,
        origin: &DeploymentId,
        trigger: FallbackTrigger,
    ) -> Result<Moved, Box<Refused>> {
        let count = |result: &str| {
            gw.metrics
                .fallbacks
                .with_label_values(&[
                    &origin.namespace,
                    &origin.name,
                    &self.label,
                    trigger.label(),
                    result,
                ])
                .inc();
        };
        let (d, tenant) = match &self.found {
            Ok(Place::Deployment(d, t)) => (d.clone(), t.clone()),
            Ok(Place::Provider(p)) => return self.to_provider(gw, refused, p, count, trigger).await,
            Err(why) => {
                count(why);
                return Err(Box::new(refused));
            }
        };
        let Refused { refusal, mut job } = refused;
        let Some(body) = with_model(&job.body, &d.served_name) else {
            // The body was read as a JSON object with a string `model` at the edge; this cannot fail.
            return Err(Box::new(Refused { refusal, job }));
        };
        let who = Who {
            namespace: d.id.namespace.clone(),
            deployment: d.id.name.clone(),
            tenant: tenant.id.clone(),
            model: d.served_name.clone(),
        };
        let estimate = crate::routes::prompt_estimate(&body);
        let lease = match gw.limiter.admit(who, &tenant, d.prices.clone(), estimate).await {
            Ok(lease) => lease,
            Err(_) => {
                count("limited");
                return Err(Box::new(Refused { refusal, job }));
            }
        };
        count("moved");
        crate::trace::moved(&job.record.span, trigger.label(), &d.id.to_string());
        job.lease = lease;
        job.body = body;
        job.routed.model = d.served_name.clone();
        job.record.namespace = d.id.namespace.clone();
        job.record.deployment = d.id.name.clone();
        let id = d.id.clone();
        job.auth = Authorized {
            deployment: d,
            tenant,
            adapter: None,
        };
        Ok(Moved::Deployment(job, id))
    }

    /// Moves the request to provider `p`: the caller's tenant (of the deployment it was sent to) with
    /// that tenant's limits, counted and priced for `provider:<name>` (a new lease).
    async fn to_provider(
        &self,
        gw: &Gateway,
        refused: Refused,
        p: &Arc<Provider>,
        count: impl Fn(&str),
        trigger: FallbackTrigger,
    ) -> Result<Moved, Box<Refused>> {
        let Refused { refusal, mut job } = refused;
        let who = Who {
            namespace: job.auth.deployment.id.namespace.clone(),
            deployment: p.label(),
            tenant: job.auth.tenant.id.clone(),
            model: p.model.clone(),
        };
        let estimate = crate::routes::prompt_estimate(&job.body);
        let tenant = job.auth.tenant.clone();
        let lease = match gw.limiter.admit(who, &tenant, p.prices.clone(), estimate).await {
            Ok(lease) => lease,
            Err(_) => {
                count("limited");
                return Err(Box::new(Refused { refusal, job }));
            }
        };
        count("moved");
        crate::trace::moved(&job.record.span, trigger.label(), &p.label());
        job.lease = lease;
        job.record.deployment = p.label();
        Ok(Moved::Provider(job, p.clone()))
    }
}

/// `body` (a JSON object) with `model` set to `model`.
fn with_model(body: &[u8], model: &str) -> Option<Bytes> {
    let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    v.insert("model".into(), serde_json::Value::String(model.into()));
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_names_the_target_and_keeps_everything_else() {
        let body =
            br#"{"model":"big","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":8}"#;
        let moved = with_model(body, "small").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&moved).unwrap();
        assert_eq!(v["model"], "small");
        assert_eq!(v["messages"][0]["content"], "hi");
        assert_eq!(
            (v["stream"].as_bool(), v["max_tokens"].as_u64()),
            (Some(true), Some(8))
        );
        assert!(with_model(b"[1]", "small").is_none());
    }
}
