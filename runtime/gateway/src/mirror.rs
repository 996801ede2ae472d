//! The shadow step: while `status.rollout.mirrorPercent` is above 0, a share of the requests routed to
//! stable ([`crate::canary::Split::mirrors`]) is also sent, as a fire-and-forget copy, to a canary pod
//! (chosen by the same affinity key among the canary's pods). The copy carries the same body and the
//! same headers (the caller's `Authorization` included) plus `x-modelfleet-mirror: 1`; its answer is
//! read to the end, timed and judged for the canary's metrics (`mirrored="true"`), then discarded.
//!
//! Invariants: the client only ever sees the real answer, and a copy never delays or fails it (the copy
//! is a separate task, started without waiting); a copy is not counted against the tenant's limits,
//! usage or budgets, nor in `modelfleet_gateway_requests_total`; at most [`MAX_IN_FLIGHT`] copies run at
//! once — beyond that, and when the canary has no Ready pod, the copy is dropped and counted
//! (`modelfleet_gateway_mirror_dropped_total`); a copy waits for its first byte no longer than the real
//! request's deadline, for each later chunk no longer than `--upstream-idle-timeout`, and lives at most
//! [`MAX_DURATION`].

use crate::fleet::{Deployment, Pod};
use crate::proxy::Job;
use crate::revision::{Probe, status_ok};
use crate::route::choose_revision;
use crate::state::Gateway;
use axum::http::{HeaderMap, HeaderValue, header};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::Instrument;

/// Copies in flight at most (per gateway replica).
pub const MAX_IN_FLIGHT: usize = 64;
/// Longest a copy is read before it is given up (without a verdict).
pub const MAX_DURATION: Duration = Duration::from_secs(600);
/// Request header marking a copy.
pub const MIRROR_HEADER: &str = "x-modelfleet-mirror";

/// The copies' slots.
pub struct Mirrors {
    slots: Arc<Semaphore>,
}

impl Mirrors {
    /// At most `max` copies in flight.
    pub fn new(max: usize) -> Mirrors {
        Mirrors {
            slots: Arc::new(Semaphore::new(max)),
        }
    }
}

/// What a copy needs of its request.
struct Copy {
    path: String,
    headers: HeaderMap,
    body: Bytes,
    deadline: Instant,
}

/// Sends a copy of `job` (affinity `key`) to a canary pod of its deployment, in the background, if the
/// split mirrors it.
pub fn launch(gw: &Arc<Gateway>, job: &Job, key: u64) {
    let d: &Deployment = &job.auth.deployment;
    let Some(split) = d.split.as_ref() else {
        return;
    };
    if !split.mirrors(&job.auth.tenant.id, key) {
        return;
    }
    let dropped = |reason: &str| {
        gw.metrics
            .revisions
            .mirror_dropped
            .with_label_values(&[&d.id.namespace, &d.id.name, reason])
            .inc();
    };
    let Ok(permit) = gw.mirrors.slots.clone().try_acquire_owned() else {
        return dropped("full");
    };
    let adapter = job.auth.adapter.as_deref();
    let Some(choice) = choose_revision(gw, d, key, adapter, &split.canary) else {
        return dropped("no_pod");
    };
    // The copy is its own CLIENT span under the request's: the canary pod's span joins it.
    let span = tracing::info_span!(
        "mirror",
        otel.kind = "client",
        modelfleet.pod = %choice.pod.name,
        modelfleet.revision = %choice.pod.revision,
    );
    let mut headers = crate::trace::to_pod(&job.headers, &span);
    headers.insert(MIRROR_HEADER, HeaderValue::from_static("1"));
    let copy = Copy {
        path: job.path.clone(),
        headers,
        body: job.body.clone(),
        deadline: job.deadline,
    };
    let probe = Probe::new(gw.metrics.clone(), &d.id, &choice.pod, true);
    let gw = gw.clone();
    tokio::spawn(
        async move {
            let _ = tokio::time::timeout(MAX_DURATION, send(gw, choice.pod, copy, probe, permit)).await;
        }
        .instrument(span),
    );
}

/// Sends the copy and reads its answer to the end, judging it.
async fn send(gw: Arc<Gateway>, pod: Pod, copy: Copy, mut probe: Probe, _permit: OwnedSemaphorePermit) {
    let _inflight = gw.loads.start(&pod.name);
    let url = format!("http://{}:{}{}", pod.ip, gw.settings.pod_port, copy.path);
    let sent = Instant::now();
    let request = gw.client.post(url).headers(copy.headers).body(copy.body).send();
    let mut resp = match tokio::time::timeout_at(copy.deadline, request).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) if e.is_connect() => return, // never reached the pod: not judged
        _ => return probe.finish(false),
    };
    let healthy = status_ok(resp.status());
    let timed = resp.status().is_success();
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut first = true;
    loop {
        let wait = if first {
            copy.deadline
        } else {
            Instant::now() + gw.settings.upstream_idle_timeout
        };
        match tokio::time::timeout_at(wait, resp.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                if std::mem::replace(&mut first, false) && timed {
                    probe.first_byte(sent.elapsed());
                }
                if sse {
                    probe.streamed(&chunk);
                }
            }
            Ok(Ok(None)) => return probe.finish(healthy),
            _ => return probe.finish(false),
        }
    }
}
