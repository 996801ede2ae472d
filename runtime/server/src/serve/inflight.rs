//! Single-flight compiles: requests for a constraint that is already being compiled wait for that
//! compile's verdict instead of queueing the same work again. Twenty concurrent requests with one new
//! schema (a client's `parse` on a batch of prompts) used to take twenty compile-queue slots, so with
//! the queue's 16 the last of them were refused (429) although the grammar they needed was on its way.
//!
//! Invariants: at most one compile per constraint key is submitted at a time by this path; a follower
//! gets exactly the leader's verdict (the grammar, or the refusal, which it names with its own field),
//! or — when the leader went away without one (refused as busy, cancelled) — falls back to compiling
//! on its own; an entry is removed when its leader finishes or is dropped, so the map holds only
//! compiles under way.

use modelfleet_engine::constraint::CompiledGrammar;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// What a leader's compile came to, for its followers.
#[derive(Clone)]
pub enum Verdict {
    /// The compiled grammar.
    Ready(Arc<CompiledGrammar>),
    /// A refusal (400), its message without the field's name.
    Refused(String),
}

type Slot = watch::Receiver<Option<Verdict>>;

/// Compiles under way, by constraint key.
#[derive(Default)]
pub struct Inflight {
    map: Arc<Mutex<HashMap<String, Slot>>>,
}

/// The first request for a key: it compiles, then [`Lead::finish`]es with the verdict.
pub struct Lead {
    map: Arc<Mutex<HashMap<String, Slot>>>,
    key: String,
    tx: watch::Sender<Option<Verdict>>,
}

/// A later request for a key under way: [`Follow::verdict`] waits for the leader's.
pub struct Follow(Slot);

impl Inflight {
    /// Leads the compile of `key`, or follows the one under way.
    pub fn join(&self, key: String) -> Result<Lead, Follow> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rx) = map.get(&key) {
            return Err(Follow(rx.clone()));
        }
        let (tx, rx) = watch::channel(None);
        map.insert(key.clone(), rx);
        Ok(Lead {
            map: self.map.clone(),
            key,
            tx,
        })
    }

    /// Compiles under way (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

impl Lead {
    /// Hands `verdict` to every follower and ends the compile's entry.
    pub fn finish(self, verdict: Verdict) {
        self.tx.send_replace(Some(verdict));
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        // Finished or abandoned: new requests start afresh (the cache has a grammar that compiled).
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

impl Follow {
    /// The leader's verdict, or `None` when it left without one or took longer than `budget`.
    pub async fn verdict(mut self, budget: std::time::Duration) -> Option<Verdict> {
        match tokio::time::timeout(budget, self.0.wait_for(Option::is_some)).await {
            Ok(Ok(v)) => (*v).clone(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn followers_get_the_leaders_verdict_and_the_entry_goes() {
        let inflight = Inflight::default();
        let lead = inflight.join("k".into()).ok().unwrap();
        let follow = inflight.join("k".into()).err().unwrap();
        assert!(inflight.join("other".into()).is_ok(), "another key leads its own");
        assert_eq!(inflight.len(), 1, "the other lead was dropped at once");
        let waiting = tokio::spawn(follow.verdict(Duration::from_secs(5)));
        lead.finish(Verdict::Refused("no".into()));
        match waiting.await.unwrap() {
            Some(Verdict::Refused(m)) => assert_eq!(m, "no"),
            _ => panic!("the follower got the leader's refusal"),
        }
        assert_eq!(inflight.len(), 0);
        assert!(inflight.join("k".into()).is_ok(), "a new request leads again");
    }

    #[tokio::test]
    async fn an_abandoned_lead_releases_its_followers_at_once() {
        let inflight = Inflight::default();
        let lead = inflight.join("k".into()).ok().unwrap();
        let follow = inflight.join("k".into()).err().unwrap();
        drop(lead);
        let t0 = std::time::Instant::now();
        assert!(follow.verdict(Duration::from_secs(5)).await.is_none());
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert_eq!(inflight.len(), 0);
    }
}
