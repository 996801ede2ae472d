//! How far a fetch has come, for whoever watches it (the progress endpoint the operator polls while a
//! pod starts, the log, the report `serve` turns into metrics): the phase, bytes so far against the
//! bytes expected, and how long each phase took.
//!
//! Invariants: counters only move forward within a phase, except when a source restarts a transfer
//! from zero ([`Progress::retract`]); a clone shares the same counters; reading never blocks a writer
//! for longer than copying a few numbers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The phases of a start, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// Nothing started yet.
    Starting,
    /// Checking a signature against the configured key.
    Signature,
    /// Downloading or copying bytes.
    Pull,
    /// Hashing what was pulled (or what is mounted).
    Verify,
    /// Moving the verified artifact into place (and into the cache).
    Install,
    /// Finished.
    Done,
}

impl Phase {
    /// The lower-case name used in metrics and messages.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Signature => "signature",
            Phase::Pull => "pull",
            Phase::Verify => "verify",
            Phase::Install => "install",
            Phase::Done => "done",
        }
    }
}

/// The current phase, when it began, and the durations of the phases before it.
#[derive(Debug)]
struct Phases {
    current: Phase,
    since: Instant,
    done: Vec<(Phase, Duration)>,
}

#[derive(Debug)]
struct Inner {
    bytes: AtomicU64,
    expected: AtomicU64,
    started: Instant,
    phases: Mutex<Phases>,
}

/// Shared progress counters of one fetch.
#[derive(Clone, Debug)]
pub struct Progress(Arc<Inner>);

impl Default for Progress {
    fn default() -> Self {
        let now = Instant::now();
        Progress(Arc::new(Inner {
            bytes: AtomicU64::new(0),
            expected: AtomicU64::new(0),
            started: now,
            phases: Mutex::new(Phases {
                current: Phase::Starting,
                since: now,
                done: Vec::new(),
            }),
        }))
    }
}

/// A consistent copy of the counters.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// The current phase.
    pub phase: Phase,
    /// Bytes pulled so far.
    pub bytes: u64,
    /// Bytes the artifact is known to have (0: not known yet).
    pub expected_bytes: u64,
    /// Seconds since the fetch began.
    pub elapsed_seconds: f64,
    /// Seconds in the current phase.
    pub phase_seconds: f64,
    /// Seconds each finished phase took, in order.
    pub phases: Vec<(Phase, f64)>,
}

impl Progress {
    /// Adds `n` bytes to what the artifact is known to have.
    pub fn expect(&self, n: u64) {
        self.0.expected.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts `n` more bytes pulled.
    pub fn add(&self, n: u64) {
        self.0.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Takes back `n` bytes a source discarded to start a transfer over.
    pub fn retract(&self, n: u64) {
        let _ = self
            .0
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(n))
            });
    }

    /// Enters `phase` (a phase already passed is ignored: phases only move forward).
    pub fn enter(&self, phase: Phase) {
        let mut p = self.0.phases.lock().unwrap_or_else(|e| e.into_inner());
        if phase <= p.current {
            return;
        }
        let now = Instant::now();
        if p.current != Phase::Starting {
            let took = now - p.since;
            let previous = p.current;
            p.done.push((previous, took));
        }
        p.current = phase;
        p.since = now;
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        let p = self.0.phases.lock().unwrap_or_else(|e| e.into_inner());
        Snapshot {
            phase: p.current,
            bytes: self.0.bytes.load(Ordering::Relaxed),
            expected_bytes: self.0.expected.load(Ordering::Relaxed),
            elapsed_seconds: self.0.started.elapsed().as_secs_f64(),
            phase_seconds: p.since.elapsed().as_secs_f64(),
            phases: p.done.iter().map(|(ph, d)| (*ph, d.as_secs_f64())).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_move_forward_and_keep_their_durations() {
        let p = Progress::default();
        p.expect(100);
        p.enter(Phase::Pull);
        p.add(60);
        p.retract(10);
        p.add(50);
        p.enter(Phase::Verify);
        p.enter(Phase::Pull); // ignored: already past it
        let s = p.snapshot();
        assert_eq!((s.phase, s.bytes, s.expected_bytes), (Phase::Verify, 100, 100));
        assert_eq!(s.phases.len(), 1);
        assert_eq!(s.phases[0].0, Phase::Pull);
        p.enter(Phase::Done);
        let phases: Vec<Phase> = p.snapshot().phases.iter().map(|x| x.0).collect();
        assert_eq!(phases, [Phase::Pull, Phase::Verify]);
    }
}
