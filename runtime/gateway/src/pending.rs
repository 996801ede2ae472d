//! Requests held while their deployment has no Ready pod — a deployment scaled to zero, or one whose
//! pods are all starting. The count per deployment is `modelfleet_gateway_pending_requests`, which the
//! operator reads to scale the deployment from zero (so `status.desiredReplicas` keeps one writer).
//!
//! Invariants: at most `max` requests wait per deployment (one more is a 429 with `Retry-After`); a
//! waiter is counted from [`Pending::enter`] until its guard drops, however the request ends.

use crate::fleet::DeploymentId;
use crate::metrics::Metrics;
use modelfleet_api::error::{ApiError, ApiErrorKind};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// `Retry-After` of a refusal because too many requests wait already.
pub const RETRY_AFTER_SECS: u32 = 5;

/// The per-deployment waiting rooms.
pub struct Pending {
    counts: Mutex<HashMap<DeploymentId, usize>>,
    max: usize,
    metrics: Arc<Metrics>,
}

/// One waiting request; dropping it leaves the room.
pub struct PendingGuard {
    pending: Arc<Pending>,
    id: DeploymentId,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        let mut counts = self.pending.counts.lock().unwrap();
        let n = counts.get_mut(&self.id).expect("entered");
        *n -= 1;
        let left = *n;
        if left == 0 {
            counts.remove(&self.id);
        }
        self.pending.gauge(&self.id, left);
    }
}

impl Pending {
    /// At most `max` waiters per deployment.
    pub fn new(max: usize, metrics: Arc<Metrics>) -> Arc<Pending> {
        Arc::new(Pending {
            counts: Mutex::default(),
            max,
            metrics,
        })
    }

    fn gauge(&self, id: &DeploymentId, n: usize) {
        self.metrics
            .pending
            .with_label_values(&[&id.namespace, &id.name])
            .set(n as i64);
    }

    /// Joins `id`'s waiting room, or refuses when it is full.
    pub fn enter(self: &Arc<Self>, id: &DeploymentId, model: &str) -> Result<PendingGuard, ApiError> {
        let mut counts = self.counts.lock().unwrap();
        let n = counts.entry(id.clone()).or_default();
        if *n >= self.max {
            return Err(ApiError {
                code: Some("pending_queue_full".into()),
                ..ApiError::new(
                    ApiErrorKind::RateLimited {
                        retry_after_secs: RETRY_AFTER_SECS,
                    },
                    format!(
                        "`{model}` has no ready replica yet and {} requests already wait for one \
                         (--max-pending-per-deployment)",
                        self.max
                    ),
                )
            });
        }
        *n += 1;
        self.gauge(id, *n);
        Ok(PendingGuard {
            pending: self.clone(),
            id: id.clone(),
        })
    }

    /// Requests waiting for `id` now.
    pub fn waiting(&self, id: &DeploymentId) -> usize {
        self.counts.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_released() {
        let metrics = Arc::new(Metrics::new());
        let p = Pending::new(2, metrics.clone());
        let id = DeploymentId {
            namespace: "ns".into(),
            name: "md".into(),
        };
        let a = p.enter(&id, "m").unwrap();
        let b = p.enter(&id, "m").unwrap();
        let e = p.enter(&id, "m").err().unwrap();
        assert_eq!((e.status(), e.retry_after()), (429, Some(RETRY_AFTER_SECS)));
        assert!(
            metrics
                .render()
                .contains("modelfleet_gateway_pending_requests{model_deployment=\"md\",namespace=\"ns\"} 2")
        );
        drop(a);
        drop(b);
        assert_eq!(p.waiting(&id), 0);
        assert!(
            metrics
                .render()
                .contains("modelfleet_gateway_pending_requests{model_deployment=\"md\",namespace=\"ns\"} 0")
        );
    }
}
