//! The waiting requests: one queue per tenant, ordered by priority then arrival, and a fair choice of
//! which tenant's request is admitted next.
//!
//! Fairness is deficit round-robin by tokens in its counter form (the Virtual Token Counter of Sheng
//! et al., "Fairness in Serving Large Language Models", OSDI '24): every token a tenant is served —
//! prompt tokens computed and tokens generated, charged by the scheduler as it grants them — adds to
//! the tenant's counter, and the next admission goes to the backlogged tenant with the smallest
//! counter. A tenant that becomes active again is lifted to the smallest counter among active tenants,
//! so idling never banks credit; ties go to the tenant admitted least recently, so a newcomer's lone
//! request is admitted at the very next admission, however long another tenant's backlog is.
//!
//! Invariants: a request's `priority` orders it only among its own tenant's requests; `len()` and
//! `queued_tokens()` always equal the sums over the per-tenant queues; each request id appears once.

use crate::kv::RequestId;
use std::collections::{BTreeMap, HashMap};

/// Where a request sits in its tenant's queue: priority, then arrival order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey {
    /// Lower first.
    pub priority: i32,
    /// Arrival sequence number (preempted requests keep theirs, so they go back near the front).
    pub seq: u64,
}

#[derive(Default)]
struct TenantState {
    queue: BTreeMap<QueueKey, (RequestId, usize)>,
    /// Tokens served so far (the virtual token counter).
    served: u64,
    /// Requests of this tenant in the running batch.
    running: usize,
    /// Admission stamp of the tenant's last admitted request (0 = never).
    last_admit: u64,
}

impl TenantState {
    fn active(&self) -> bool {
        !self.queue.is_empty() || self.running > 0
    }
}

/// Per-tenant waiting queues with token-fair selection.
#[derive(Default)]
pub struct FairQueue {
    tenants: HashMap<String, TenantState>,
    len: usize,
    tokens: usize,
    admissions: u64,
}

impl FairQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens (still to compute) of the waiting requests.
    pub fn queued_tokens(&self) -> usize {
        self.tokens
    }

    fn min_active_served(&self, except: &str) -> Option<u64> {
        self.tenants
            .iter()
            .filter(|(t, s)| t.as_str() != except && s.active())
            .map(|(_, s)| s.served)
            .min()
    }

    /// Queues `id` (with `tokens` still to compute) for `tenant`.
    pub fn push(&mut self, tenant: &str, key: QueueKey, id: RequestId, tokens: usize) {
        let floor = self.min_active_served(tenant);
        let t = self.tenants.entry(tenant.to_owned()).or_default();
        if !t.active()
            && let Some(floor) = floor
        {
            t.served = t.served.max(floor);
        }
        let old = t.queue.insert(key, (id, tokens));
        debug_assert!(old.is_none(), "queue key {key:?} used twice");
        self.len += 1;
        self.tokens += tokens;
    }

    /// Removes a waiting request (cancelled or past its deadline); `false` if it was not queued.
    pub fn remove(&mut self, tenant: &str, key: QueueKey) -> bool {
        let Some(t) = self.tenants.get_mut(tenant) else {
            return false;
        };
        match t.queue.remove(&key) {
            Some((_, tokens)) => {
                self.len -= 1;
                self.tokens -= tokens;
                true
            }
            None => false,
        }
    }

    /// The next request to admit, skipping tenants in `skip` — the backlogged tenant with the fewest
    /// tokens served (ties: least recently admitted), and its first request by priority then arrival.
    pub fn peek(&self, skip: &[String]) -> Option<(&str, QueueKey, RequestId)> {
        let (name, t) = self
            .tenants
            .iter()
            .filter(|(n, t)| !t.queue.is_empty() && !skip.contains(n))
            .min_by_key(|(n, t)| (t.served, t.last_admit, n.as_str()))?;
        let (key, (id, _)) = t.queue.first_key_value()?;
        Some((name.as_str(), *key, *id))
    }

    /// Takes the request [`peek`](Self::peek) returned out of the queue as admitted (it now runs).
    pub fn admit(&mut self, tenant: &str, key: QueueKey) {
        if self.remove(tenant, key) {
            self.admissions += 1;
            let t = self.tenants.get_mut(tenant).expect("tenant of a queued request");
            t.last_admit = self.admissions;
            t.running += 1;
        }
    }

    /// Records that one of `tenant`'s running requests left the batch (finished or preempted).
    pub fn left_batch(&mut self, tenant: &str) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.running = t.running.saturating_sub(1);
        }
    }

    /// Charges `tokens` of service to `tenant`.
    pub fn charge(&mut self, tenant: &str, tokens: usize) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.served += tokens as u64;
        }
    }

    /// Takes back a charge for tokens that were granted and then withdrawn (preemption).
    pub fn refund(&mut self, tenant: &str, tokens: usize) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.served = t.served.saturating_sub(tokens as u64);
        }
    }

    /// Forgets tenants with nothing queued or running, keeping the map small; their counters would
    /// be lifted on return anyway.
    pub fn gc(&mut self) {
        self.tenants.retain(|_, t| t.active());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(priority: i32, seq: u64) -> QueueKey {
        QueueKey { priority, seq }
    }

    #[test]
    fn priority_orders_only_within_a_tenant() {
        let mut q = FairQueue::new();
        q.push("a", key(0, 1), 1, 10);
        q.push("a", key(-5, 2), 2, 10);
        q.push("b", key(100, 3), 3, 10);
        assert_eq!((q.len(), q.queued_tokens()), (3, 30));
        // Tenant a's priority -5 request jumps a's own queue…
        let (t, k, id) = q.peek(&[]).unwrap();
        assert_eq!((t, id), ("a", 2));
        q.admit("a", k);
        q.charge("a", 10);
        // …but does not keep b (priority 100, fewer tokens served) waiting.
        let (t, k, id) = q.peek(&[]).unwrap();
        assert_eq!((t, id), ("b", 3));
        q.admit("b", k);
        q.charge("b", 10);
        assert_eq!(q.peek(&["a".into()]), None, "skipped tenants are not chosen");
        assert_eq!(q.peek(&[]).map(|p| p.2), Some(1));
    }

    #[test]
    fn a_newcomer_is_not_behind_a_backlog_and_banks_no_credit() {
        let mut q = FairQueue::new();
        for i in 0..100 {
            q.push("big", key(0, i), i, 100);
        }
        for _ in 0..10 {
            let (_, k, _) = q.peek(&[]).unwrap();
            q.admit("big", k);
            q.charge("big", 100);
        }
        // `small` arrives after `big` was served 1,000 tokens: lifted to `big`'s counter, and it wins
        // the tie because it was never admitted.
        q.push("small", key(0, 1000), 1000, 5);
        let (t, k, id) = q.peek(&[]).unwrap();
        assert_eq!((t, id), ("small", 1000));
        q.admit("small", k);
        q.charge("small", 5);
        assert_eq!(q.peek(&[]).unwrap().0, "big");
        q.remove("big", key(0, 10));
        assert_eq!(q.len(), 89);
    }
}
