//! The admission gate: the bounds on what may wait, checked synchronously on the caller's thread so
//! an overloaded server answers 429 at once instead of queueing without bound.
//!
//! Limits: requests waiting and prompt tokens waiting, in total (`--max-num-queued-reqs`,
//! `--max-num-queued-tokens`), and per tenant: requests waiting (the server's
//! `--max-num-queued-reqs-per-tenant`, so no tenant's fan-out fills the global queue), and from the tenants
//! file requests in flight (waiting or running) and prompt tokens waiting. A "request" here is one engine
//! sequence: a request with several prompts or `n > 1` enters as a group, all or nothing
//! ([`AdmissionGate::try_enter_group`]).
//!
//! Invariants: a request is counted as waiting from a successful [`AdmissionGate::try_enter`] until
//! its first admission into a batch ([`AdmissionGate::started`]) or its end, and as in flight until
//! [`AdmissionGate::left`]; counts never go negative; a closed gate (draining for shutdown) refuses
//! everything.

use std::collections::HashMap;
use std::sync::Mutex;

/// Global queue bounds.
#[derive(Clone, Copy, Debug)]
pub struct QueueLimits {
    /// Most requests waiting (not yet admitted into a batch).
    pub max_queued_requests: usize,
    /// Most prompt tokens waiting.
    pub max_queued_tokens: usize,
}

/// One tenant's quotas (from the tenants file, and the server's per-tenant share of the queue);
/// `None` = unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// Requests waiting or running.
    pub max_concurrent_requests: Option<usize>,
    /// Prompt tokens waiting.
    pub max_queued_tokens: Option<usize>,
    /// Requests waiting (the tenant's share of the global queue).
    pub max_queued_requests: Option<usize>,
}

/// Why a request was turned away (the `reason` label of `modelfleet_requests_rejected_total`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The server-wide queue is full (requests or tokens).
    QueueFull {
        /// Which bound, as a flag name.
        limit: &'static str,
        /// Its value.
        value: usize,
    },
    /// The tenant's quota is used up.
    TenantQuota {
        /// Which quota, as the tenants-file field.
        limit: &'static str,
        /// Its value.
        value: usize,
    },
    /// The server is shutting down.
    ShuttingDown,
}

impl Rejection {
    /// A stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::QueueFull { .. } => "queue_full",
            Rejection::TenantQuota { .. } => "tenant_quota",
            Rejection::ShuttingDown => "shutting_down",
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::QueueFull { limit, value } => {
                write!(f, "the server's queue is full ({limit} = {value}); retry later")
            }
            Rejection::TenantQuota { limit, value } => {
                write!(
                    f,
                    "your tenant's quota is used up ({limit} = {value}); retry later"
                )
            }
            Rejection::ShuttingDown => f.write_str("the server is shutting down"),
        }
    }
}

#[derive(Default)]
struct Counts {
    queued_requests: usize,
    queued_tokens: usize,
    tenants: HashMap<String, TenantCounts>,
    closed: bool,
}

#[derive(Default)]
struct TenantCounts {
    in_flight: usize,
    queued_requests: usize,
    queued_tokens: usize,
}

/// Shared between the callers (who enter) and the step loop (which reports progress).
pub struct AdmissionGate {
    limits: QueueLimits,
    counts: Mutex<Counts>,
}

impl AdmissionGate {
    /// A gate with `limits`.
    pub fn new(limits: QueueLimits) -> Self {
        Self {
            limits,
            counts: Mutex::new(Counts::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // Counters stay consistent even if a holder panicked: every update is a single statement.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A cheap early refusal before any parsing or tokenizing: the gate is closed, or the request
    /// queue is already full (a burst is then answered without spending work on it).
    pub fn precheck(&self) -> Result<(), Rejection> {
        let c = self.lock();
        if c.closed {
            return Err(Rejection::ShuttingDown);
        }
        if c.queued_requests >= self.limits.max_queued_requests {
            return Err(Rejection::QueueFull {
                limit: "max-num-queued-reqs",
                value: self.limits.max_queued_requests,
            });
        }
        Ok(())
    }

    /// Counts a new request of `tenant` with `tokens` prompt tokens as waiting, or says why not.
    pub fn try_enter(&self, tenant: &str, tokens: usize, quota: TenantLimits) -> Result<(), Rejection> {
        self.try_enter_group(tenant, &[tokens], quota)
    }

    /// Counts a group of requests of one tenant (the sequences of one API request, with these prompt
    /// token counts) as waiting — all of them, or none and the reason.
    pub fn try_enter_group(
        &self,
        tenant: &str,
        tokens: &[usize],
        quota: TenantLimits,
    ) -> Result<(), Rejection> {
        let (n, sum) = (tokens.len(), tokens.iter().sum::<usize>());
        let mut c = self.lock();
        if c.closed {
            return Err(Rejection::ShuttingDown);
        }
        let l = self.limits;
        if c.queued_requests + n > l.max_queued_requests {
            return Err(Rejection::QueueFull {
                limit: "max-num-queued-reqs",
                value: l.max_queued_requests,
            });
        }
        if c.queued_tokens + sum > l.max_queued_tokens {
            return Err(Rejection::QueueFull {
                limit: "max-num-queued-tokens",
                value: l.max_queued_tokens,
            });
        }
        let t = c.tenants.get(tenant);
        let (in_flight, queued_reqs, queued) =
            t.map_or((0, 0, 0), |t| (t.in_flight, t.queued_requests, t.queued_tokens));
        if let Some(max) = quota.max_queued_requests
            && queued_reqs + n > max
        {
            return Err(Rejection::TenantQuota {
                limit: "max-num-queued-reqs-per-tenant",
                value: max,
            });
        }
        if let Some(max) = quota.max_concurrent_requests
            && in_flight + n > max
        {
            return Err(Rejection::TenantQuota {
                limit: "maxConcurrentRequests",
                value: max,
            });
        }
        if let Some(max) = quota.max_queued_tokens
            && queued + sum > max
        {
            return Err(Rejection::TenantQuota {
                limit: "maxQueuedTokens",
                value: max,
            });
        }
        c.queued_requests += n;
        c.queued_tokens += sum;
        let t = c.tenants.entry(tenant.to_owned()).or_default();
        t.in_flight += n;
        t.queued_requests += n;
        t.queued_tokens += sum;
        Ok(())
    }

    /// The request left the queue for a batch for the first time.
    pub fn started(&self, tenant: &str, tokens: usize) {
        let mut c = self.lock();
        c.queued_requests = c.queued_requests.saturating_sub(1);
        c.queued_tokens = c.queued_tokens.saturating_sub(tokens);
        if let Some(t) = c.tenants.get_mut(tenant) {
            t.queued_requests = t.queued_requests.saturating_sub(1);
            t.queued_tokens = t.queued_tokens.saturating_sub(tokens);
        }
    }

    /// The request ended; `still_queued` when it never started (its waiting counts go too).
    pub fn left(&self, tenant: &str, tokens: usize, still_queued: bool) {
        if still_queued {
            self.started(tenant, tokens);
        }
        let mut c = self.lock();
        if let Some(t) = c.tenants.get_mut(tenant) {
            t.in_flight = t.in_flight.saturating_sub(1);
            if t.in_flight == 0 {
                c.tenants.remove(tenant);
            }
        }
    }

    /// Refuses every new request from now on.
    pub fn close(&self) {
        self.lock().closed = true;
    }

    /// Requests waiting and their prompt tokens.
    pub fn queued(&self) -> (usize, usize) {
        let c = self.lock();
        (c.queued_requests, c.queued_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_enforced_and_released() {
        let g = AdmissionGate::new(QueueLimits {
            max_queued_requests: 2,
            max_queued_tokens: 100,
        });
        let none = TenantLimits::default();
        g.try_enter("a", 60, none).unwrap();
        assert_eq!(
            g.try_enter("a", 41, none),
            Err(Rejection::QueueFull {
                limit: "max-num-queued-tokens",
                value: 100
            })
        );
        g.try_enter("b", 40, none).unwrap();
        assert_eq!(g.try_enter("c", 1, none).unwrap_err().label(), "queue_full");
        g.started("a", 60);
        assert_eq!(g.queued(), (1, 40));
        let quota = TenantLimits {
            max_concurrent_requests: Some(1),
            ..TenantLimits::default()
        };
        assert_eq!(
            g.try_enter("a", 1, quota),
            Err(Rejection::TenantQuota {
                limit: "maxConcurrentRequests",
                value: 1
            }),
            "a's first request still runs"
        );
        g.left("a", 60, false);
        g.try_enter("a", 1, quota).unwrap();
        g.left("b", 40, true);
        g.left("a", 1, true);
        assert_eq!(g.queued(), (0, 0));
        g.close();
        assert_eq!(g.try_enter("a", 1, none), Err(Rejection::ShuttingDown));
    }

    #[test]
    fn a_group_enters_whole_and_one_tenant_cannot_fill_the_queue() {
        let g = AdmissionGate::new(QueueLimits {
            max_queued_requests: 32,
            max_queued_tokens: 10_000,
        });
        let share = TenantLimits {
            max_queued_requests: Some(16),
            ..TenantLimits::default()
        };
        // A fan-out of 16 fits the tenant's share once; the next is refused as the tenant's quota,
        // and nothing of it was counted.
        g.try_enter_group("a", &[10; 16], share).unwrap();
        assert_eq!(
            g.try_enter_group("a", &[10; 2], share),
            Err(Rejection::TenantQuota {
                limit: "max-num-queued-reqs-per-tenant",
                value: 16
            })
        );
        assert_eq!(g.queued(), (16, 160));
        // Another tenant still gets in, and a group that would overflow the global queue is refused
        // whole.
        g.try_enter_group("b", &[10; 16], share).unwrap();
        assert_eq!(
            g.try_enter_group("c", &[1], share).unwrap_err().label(),
            "queue_full"
        );
        assert_eq!(g.queued(), (32, 320));
        // Starting frees the tenant's share.
        for _ in 0..16 {
            g.started("a", 10);
        }
        g.try_enter_group("a", &[10; 16], share).unwrap();
    }
}
