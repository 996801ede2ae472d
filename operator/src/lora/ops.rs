//! Admin calls in flight and their outcomes, per (adapter, pod), in the leader's memory.
//!
//! A reconcile pass never waits for a pod: it asks whether a pair needs a call ([`next`], pure), and
//! [`Runner::ensure`] spawns a task that makes it (with a timeout, under the pod's concurrency limit),
//! records the outcome and wakes the adapter's reconcile through a channel. The pass then reads the
//! outcomes to build status.
//!
//! Invariants: at most one call per (adapter, pod) at a time, and an outcome is recorded only by the
//! call started last for that pair; at most [`PER_POD_CALLS`] calls to one pod at a time, so a burst
//! cannot swamp a pod, and a slow pod only delays calls to itself; failures back off (verification
//! failures for long: the same bytes fail the same way); a load is re-sent every [`RESYNC`] (idempotent:
//! the runtime answers 200), so a pod that lost an adapter gets it back. The table is lost with the
//! process: a new leader re-sends every load once, which the runtime answers 200.

use super::admin::{self, AdminError, AdminToken, Timeouts};
use crate::builders::adapters::AdapterSpec;
use crate::telemetry::Metrics;
use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::ObjectRef;
use modelfleet_crds::LoraAdapter;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Concurrent admin calls to one pod.
pub const PER_POD_CALLS: usize = 4;
/// A loaded adapter is asked for again this often (the runtime answers 200 when it has it).
pub const RESYNC: Duration = Duration::from_secs(600);
/// First retry of a failed load; doubles per failure up to [`MAX_LOAD_RETRY`].
pub const LOAD_RETRY: Duration = Duration::from_secs(5);
/// Longest wait between retries of a failed load.
pub const MAX_LOAD_RETRY: Duration = Duration::from_secs(300);
/// Retry of a load the runtime refused for its bytes (digest, compatibility).
pub const VERIFY_RETRY: Duration = Duration::from_secs(600);
/// First retry of a failed unload; doubles per failure.
pub const UNLOAD_RETRY: Duration = Duration::from_secs(2);
/// Unload attempts per pod before the finalizer gives up on that pod (it never hangs on one).
pub const MAX_UNLOAD_ATTEMPTS: u32 = 3;

/// Load or unload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `POST /v1/adapters`.
    Load,
    /// `DELETE /v1/adapters/{name}`.
    Unload,
}

/// What one pod should be asked: a changed want (spec, or a restarted runtime) means a new call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// Load or unload.
    pub kind: Kind,
    /// The adapter as the runtime sees it.
    pub entry: AdapterSpec,
    /// Restarts of the pod's runtime container when asked.
    pub restarts: i32,
}

/// An (adapter uid, pod uid) pair.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// The LoraAdapter's uid.
    pub adapter: String,
    /// The pod's uid.
    pub pod: String,
}

/// The last call of a pair.
#[derive(Clone, Debug)]
pub struct Op {
    /// What it asked.
    pub want: Want,
    /// `None` while running.
    pub result: Option<Result<(), AdminError>>,
    /// Consecutive failures of this want.
    pub failures: u32,
    /// When it finished.
    pub finished: Option<Instant>,
    /// Which start this is (only the latest start records its outcome).
    seq: u64,
}

/// Where a pair stands for the current want.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Not asked yet, or the call runs.
    InFlight,
    /// Done.
    Succeeded,
    /// Failed; `settled` when no retry will come (an unload that gave up).
    Failed {
        /// What went wrong.
        error: AdminError,
        /// No more retries.
        settled: bool,
    },
}

/// What a pass should do about a pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Start a call now.
    Start,
    /// Nothing now; look again after this long.
    After(Duration),
    /// Nothing: a running call wakes the adapter when it ends, or nothing is left to do.
    Idle,
}

fn doubling(base: Duration, failures: u32, max: Duration) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    (base * factor).min(max)
}

/// The decision for a pair whose last call is `op`, given what it should be asked now.
pub fn next(op: Option<&Op>, want: &Want, now: Instant) -> Next {
    let Some(op) = op else {
        return Next::Start;
    };
    let (Some(result), Some(finished)) = (&op.result, op.finished) else {
        return Next::Idle; // running; even for an older want, one call at a time
    };
    if op.want != *want {
        return Next::Start;
    }
    let wait = match (want.kind, result) {
        (Kind::Load, Ok(())) => RESYNC,
        (Kind::Unload, Ok(())) => return Next::Idle,
        (Kind::Unload, Err(_)) if op.failures >= MAX_UNLOAD_ATTEMPTS => return Next::Idle,
        (Kind::Unload, Err(_)) => doubling(UNLOAD_RETRY, op.failures, MAX_LOAD_RETRY),
        (Kind::Load, Err(e)) if e.reason.is_verification() => VERIFY_RETRY,
        (Kind::Load, Err(_)) => doubling(LOAD_RETRY, op.failures, MAX_LOAD_RETRY),
    };
    let elapsed = now.saturating_duration_since(finished);
    if elapsed >= wait {
        Next::Start
    } else {
        Next::After(wait - elapsed)
    }
}

/// The table of pairs and the per-pod limits.
#[derive(Default)]
pub struct Ops {
    ops: HashMap<Key, Op>,
    pods: HashMap<String, Arc<Semaphore>>,
    seq: u64,
}

impl Ops {
    /// The last call of a pair.
    pub fn get(&self, key: &Key) -> Option<&Op> {
        self.ops.get(key)
    }

    /// Where a pair stands for `want`.
    pub fn progress(&self, key: &Key, want: &Want) -> Progress {
        match self.ops.get(key) {
            Some(Op {
                want: w,
                result: Some(result),
                failures,
                ..
            }) if w == want => match result {
                Ok(()) => Progress::Succeeded,
                Err(error) => Progress::Failed {
                    error: error.clone(),
                    settled: want.kind == Kind::Unload && *failures >= MAX_UNLOAD_ATTEMPTS,
                },
            },
            _ => Progress::InFlight,
        }
    }

    /// Records the start of a call; returns its sequence number and the pod's limit.
    fn begin(&mut self, key: Key, want: Want) -> (u64, Arc<Semaphore>) {
        self.seq += 1;
        let failures = match self.ops.get(&key) {
            Some(op) if op.want == want => op.failures,
            _ => 0,
        };
        let permits = self
            .pods
            .entry(key.pod.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(PER_POD_CALLS)))
            .clone();
        let op = Op {
            want,
            result: None,
            failures,
            finished: None,
            seq: self.seq,
        };
        self.ops.insert(key, op);
        (self.seq, permits)
    }

    /// Records the outcome of call `seq`; false when a later call (or a `forget`) superseded it.
    fn end(&mut self, key: &Key, seq: u64, result: Result<(), AdminError>, now: Instant) -> bool {
        let Some(op) = self.ops.get_mut(key).filter(|op| op.seq == seq) else {
            return false;
        };
        op.failures = if result.is_ok() { 0 } else { op.failures + 1 };
        op.result = Some(result);
        op.finished = Some(now);
        true
    }

    /// Drops the adapter's pairs on pods for which `keep` is false (gone, or no longer targets).
    pub fn retain(&mut self, adapter: &str, keep: impl Fn(&str) -> bool) {
        self.ops.retain(|k, _| k.adapter != adapter || keep(&k.pod));
        self.gc_pods();
    }

    /// Drops all of the adapter's pairs (running calls finish but record nothing).
    pub fn forget(&mut self, adapter: &str) {
        self.retain(adapter, |_| false);
    }

    fn gc_pods(&mut self) {
        let ops = &self.ops;
        self.pods
            .retain(|pod, s| ops.keys().any(|k| &k.pod == pod) || s.available_permits() < PER_POD_CALLS);
    }
}

/// One call to make.
#[derive(Clone, Debug)]
pub struct Call {
    /// The pair.
    pub key: Key,
    /// What to ask.
    pub want: Want,
    /// `http://<pod ip>:<admin port>`.
    pub base: String,
    /// The admin token.
    pub token: AdminToken,
    /// A served name this adapter had before (renamed): unloaded first, before loading the new one.
    pub unload_first: Option<String>,
    /// The adapter to wake when the call ends.
    pub adapter: ObjectRef<LoraAdapter>,
}

/// Starts calls and wakes adapters when they end.
#[derive(Clone)]
pub struct Runner {
    /// Client for admin calls.
    pub http: reqwest::Client,
    /// The shared table.
    pub ops: Arc<Mutex<Ops>>,
    /// Wakes the reconcile of an adapter.
    pub wake: UnboundedSender<ObjectRef<LoraAdapter>>,
    /// Call timeouts.
    pub timeouts: Timeouts,
    /// Port of the pods' admin API ([`crate::labels::ADMIN_PORT`]; tests point it at a fake).
    pub admin_port: i32,
    /// Counts calls by kind and result.
    pub metrics: Arc<Metrics>,
}

impl Runner {
    /// The admin API of the pod at `ip`.
    pub fn base_url(&self, ip: &str) -> String {
        admin::base_url(ip, self.admin_port)
    }

    /// Starts `call` if its pair needs one now. Returns when the pair wants another look, if a timer
    /// (not a finishing call) is what brings it.
    pub fn ensure(&self, call: Call, now: Instant) -> Option<Duration> {
        let (seq, permits) = {
            let mut ops = self.ops.lock().unwrap();
            match next(ops.get(&call.key), &call.want, now) {
                Next::Idle => return None,
                Next::After(d) => return Some(d),
                Next::Start => ops.begin(call.key.clone(), call.want.clone()),
            }
        };
        let runner = self.clone();
        tokio::spawn(async move {
            let _permit = permits.acquire_owned().await;
            let result = runner.call(&call).await;
            let kind = match call.want.kind {
                Kind::Load => "load",
                Kind::Unload => "unload",
            };
            let label = match &result {
                Ok(()) => "ok",
                Err(e) => e.reason.as_str(),
            };
            runner
                .metrics
                .adapter_calls
                .with_label_values(&[kind, label])
                .inc();
            let recorded = runner
                .ops
                .lock()
                .unwrap()
                .end(&call.key, seq, result, Instant::now());
            if recorded {
                let _ = runner.wake.unbounded_send(call.adapter);
            }
        });
        None
    }

    async fn call(&self, call: &Call) -> Result<(), AdminError> {
        let t = self.timeouts;
        match call.want.kind {
            Kind::Load => {
                if let Some(old) = &call.unload_first
                    && let Err(e) = admin::unload(&self.http, &call.base, &call.token, old, t.unload).await
                {
                    tracing::info!(adapter = %call.adapter, old = %old, error = %e.message, "unloading the old served name failed");
                }
                admin::load(&self.http, &call.base, &call.token, &call.want.entry, t.load).await
            }
            Kind::Unload => {
                admin::unload(
                    &self.http,
                    &call.base,
                    &call.token,
                    &call.want.entry.name,
                    t.unload,
                )
                .await
            }
        }
    }
}

#[cfg(test)]
mod tests;
