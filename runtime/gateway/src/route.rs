//! Which pod takes a request: among the deployment's Ready pods — those not tried yet by this request,
//! not ejected (unless every one is), and, for an adapter, those whose status says it is loaded (all
//! of them while the status lists none: a pod without it answers 404 and the request moves on) — the
//! CHWBL ring picks by affinity key and load, or round robin when so configured. During a canary rollout
//! the candidates are first restricted to one revision's pods ([`crate::canary`]): the ring then works
//! within that revision, and falls back to the other revision only when it has no pod left to try.
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
    /// Whether the wanted revision had no pod left to try (another revision's pod was chosen).
    pub fallback: bool,
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
    let mut waiting: Option<(PendingGuard, tracing::Span)> = None;
    loop {
        let current = rx.borrow_and_update().deployments.get(id).cloned();
        match current {
            None => return Err(not_found(model)),
            Some(d) if !d.pods.is_empty() => return Ok(d),
            Some(_) => {}
        }
        // A wait already over (a fallback's `noReadyReplicaWaitSeconds: 0`) ends here: a timer, even
        // one due now, fires at the timer wheel's next millisecond tick.
        if Instant::now() >= until {
            return Err(no_ready_replica(model));
        }
        if waiting.is_none() {
            // The span lasts as long as the wait (scale from zero, or every pod gone).
            let span = tracing::info_span!("wait_for_replica", gen_ai.request.model = %model);
            waiting = Some((gw.pending.enter(id, model)?, span));
        }
        match tokio::time::timeout_at(until, rx.changed()).await {
            Ok(Ok(())) => continue,
            Ok(Err(_)) => {
                return Err(ApiError::new(
                    ApiErrorKind::Unavailable,
                    "the gateway is shutting down",
                ));
            }
            Err(_) => return Err(no_ready_replica(model)),
        }
    }
}

/// The 504 of a request whose deployment had no Ready replica in time.
fn no_ready_replica(model: &str) -> ApiError {
    ApiError {
        code: Some("no_ready_replica".into()),
        ..ApiError::new(
            ApiErrorKind::Timeout,
            format!("`{model}` had no ready replica before the request's deadline"),
        )
    }
}

/// Which revision a request should go to: the side of the deployment's split its tenant and affinity
/// key fall on (`None` without a split: every pod).
pub fn wanted(d: &Deployment, tenant: &str, key: u64) -> Option<String> {
    let split = d.split.as_ref()?;
    Some(split.revision(split.side(tenant, key)).to_string())
}

/// Chooses a pod of `d` for a request with affinity `key`, or `None` when every candidate was tried.
/// With a split and a `want`ed revision, the candidates are that revision's pods; when none is left to
/// try, the other revision's (a fallback), then any other pod's.
pub fn choose(
    gw: &Gateway,
    d: &Deployment,
    key: u64,
    adapter: Option<&str>,
    tried: &[String],
    want: Option<&str>,
) -> Option<Choice> {
    let (Some(want), Some(split)) = (want, d.split.as_ref()) else {
        return choose_among(gw, d, key, adapter, tried, |_| true);
    };
    let other = split.other(want);
    let tier = |p: &Pod| match p.revision.as_str() {
        r if r == want => 0,
        r if r == other => 1,
        _ => 2,
    };
    (0..3).find_map(|t| {
        choose_among(gw, d, key, adapter, tried, |p| tier(p) == t).map(|c| Choice { fallback: t > 0, ..c })
    })
}

/// Chooses a pod of revision `rev` only (a mirrored copy's), or `None` when it has none.
pub fn choose_revision(
    gw: &Gateway,
    d: &Deployment,
    key: u64,
    adapter: Option<&str>,
    rev: &str,
) -> Option<Choice> {
    choose_among(gw, d, key, adapter, &[], |p| p.revision == rev)
}

/// Chooses among the pods `among` accepts, as the module header says.
fn choose_among(
    gw: &Gateway,
    d: &Deployment,
    key: u64,
    adapter: Option<&str>,
    tried: &[String],
    among: impl Fn(&Pod) -> bool,
) -> Option<Choice> {
    let loaded = adapter.and_then(|a| d.adapters.get(a)).map(|a| &a.loaded_on);
    let has_adapter = |p: &Pod| among(p) && loaded.is_none_or(|l| l.is_empty() || l.contains(&p.name));
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
        fallback: false,
    })
}
