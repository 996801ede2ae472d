//! Which pod takes a request: among the deployment's Ready pods — those not tried yet by this request,
//! not ejected (unless every one is), and, for an adapter, those whose status says it is loaded (all
//! of them while the status lists none: a pod without it answers 404 and the request moves on) — the
//! CHWBL ring picks by affinity key and load, or round robin when so configured.
//!
//! A deployment without a Ready pod holds the request in its waiting room until a pod turns Ready,
//! the wait limit (→ 504) or the deployment disappears (→ 404).

use crate::config::Routing;
use crate::edge::not_found;
use crate::fleet::{Deployment, DeploymentId, Pod};
use crate::pending::PendingGuard;
use crate::ring::Decision;
use crate::state::Gateway;
use modelfleet_api::error::{ApiError, ApiErrorKind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::time::Instant;

/// The pod chosen and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The pod.
    pub pod: Pod,
    /// How it was chosen.
    pub decision: Decision,
}

/// The latest snapshot of deployment `id` once it has a Ready pod; holds the request (counted as
/// pending) while it has none, until `until`.
pub async fn ready_deployment(
    gw: &Gateway,
    id: &DeploymentId,
    model: &str,
    until: Instant,
) -> Result<Arc<Deployment>, ApiError> {
    let mut rx = gw.fleet.clone();
    let mut waiting: Option<PendingGuard> = None;
    loop {
        let current = rx.borrow_and_update().deployments.get(id).cloned();
        match current {
            None => return Err(not_found(model)),
            Some(d) if !d.pods.is_empty() => return Ok(d),
            Some(_) => {}
        }
        if waiting.is_none() {
            waiting = Some(gw.pending.enter(id, model)?);
        }
        match tokio::time::timeout_at(until, rx.changed()).await {
            Ok(Ok(())) => continue,
            Ok(Err(_)) => {
                return Err(ApiError::new(
                    ApiErrorKind::Unavailable,
                    "the gateway is shutting down",
                ));
            }
            Err(_) => {
                return Err(ApiError {
                    code: Some("no_ready_replica".into()),
                    ..ApiError::new(
                        ApiErrorKind::Timeout,
                        format!("`{model}` had no ready replica before the request's deadline"),
                    )
                });
            }
        }
    }
}

/// Chooses a pod of `d` for a request with affinity `key`, or `None` when every candidate was tried.
pub fn choose(
    gw: &Gateway,
    d: &Deployment,
    key: u64,
    adapter: Option<&str>,
    tried: &[String],
) -> Option<Choice> {
    let loaded = adapter.and_then(|a| d.adapters.get(a)).map(|a| &a.loaded_on);
    let has_adapter = |p: &Pod| loaded.is_none_or(|l| l.is_empty() || l.contains(&p.name));
    // Ejected pods are tried only when every pod that could serve is ejected.
    let any_healthy = d
        .pods
        .iter()
        .any(|p| has_adapter(p) && !gw.loads.ejected(&p.name));
    let eligible: Vec<bool> = d
        .pods
        .iter()
        .map(|p| has_adapter(p) && !tried.contains(&p.name) && (!any_healthy || !gw.loads.ejected(&p.name)))
        .collect();
    let candidates = eligible.iter().filter(|e| **e).count();
    if candidates == 0 {
        return None;
    }
    let (index, decision) = match gw.settings.routing {
        Routing::Affinity => d.ring.choose(
            key,
            |i| eligible[i],
            |i| gw.loads.load(&d.pods[i].name),
            gw.settings.load_factor,
            gw.settings.load_floor,
        )?,
        Routing::RoundRobin => {
            let nth = gw.turn.fetch_add(1, Ordering::Relaxed) % candidates;
            let index = (0..d.pods.len()).filter(|&i| eligible[i]).nth(nth)?;
            let decision = if candidates == 1 {
                Decision::Only
            } else {
                Decision::Overflow
            };
            (index, decision)
        }
    };
    Some(Choice {
        pod: d.pods[index].clone(),
        decision,
    })
}
