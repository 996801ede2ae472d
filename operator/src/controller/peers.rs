//! What a pass needs to see beyond its own ModelDeployment: every ModelDeployment and LoraAdapter in
//! the operator's scope (for served-name conflicts, [`super::served_names`]), and a way to ask for a
//! peer to be reconciled when a conflict with it appears or clears.
//!
//! The operator runs one controller per partition of its scope (every namespace, or each listed one,
//! see [`crate::scope`]); each partition's watches feed its own caches, and [`Peers`] reads them all,
//! so a conflict across two watched namespaces is seen from both sides. Invariant: a wake for a
//! deployment goes to the controller of the partition that holds its namespace.

use super::served_names::{self, Clash};
use crate::config::ServedNameScope;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use modelfleet_crds::{LoraAdapter, ModelDeployment};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// The caches of every partition and their wake channels.
pub struct Peers {
    mds: Vec<Store<ModelDeployment>>,
    adapters: Vec<Store<LoraAdapter>>,
    wakes: Vec<(Option<String>, UnboundedSender<ObjectRef<ModelDeployment>>)>,
    /// Per ModelDeployment: the deployments it last conflicted with (to wake them when that changes).
    last: Mutex<HashMap<ObjectRef<ModelDeployment>, BTreeSet<String>>>,
}

/// One partition's ends: the writers its watches fill, and the wakes its controller receives.
pub struct Feeds {
    /// The partition (`None`: every namespace).
    pub partition: Option<String>,
    /// Fed by the partition's ModelDeployment watch (also the controller's own store).
    pub mds: Writer<ModelDeployment>,
    /// The reader of `mds`, for the controller.
    pub mds_reader: Store<ModelDeployment>,
    /// Fed by the partition's LoraAdapter watch.
    pub adapters: Writer<LoraAdapter>,
    /// Deployments to reconcile because a peer's conflict changed.
    pub woken: UnboundedReceiver<ObjectRef<ModelDeployment>>,
}

impl Peers {
    /// Caches and channels for `partitions`.
    pub fn new(partitions: Vec<Option<String>>) -> (Peers, Vec<Feeds>) {
        let mut peers = Peers::empty();
        let mut feeds = Vec::new();
        for partition in partitions {
            let (mds_reader, mds) = reflector::store();
            let (adapters_reader, adapters) = reflector::store();
            let (wake, woken) = unbounded();
            peers.mds.push(mds_reader.clone());
            peers.adapters.push(adapters_reader);
            peers.wakes.push((partition.clone(), wake));
            feeds.push(Feeds {
                partition,
                mds,
                mds_reader,
                adapters,
                woken,
            });
        }
        (peers, feeds)
    }

    /// No partitions (tests).
    pub fn empty() -> Peers {
        Peers {
            mds: Vec::new(),
            adapters: Vec::new(),
            wakes: Vec::new(),
            last: Mutex::new(HashMap::new()),
        }
    }

    /// The served names `md` shares with another deployment in `scope`; wakes the peers whose
    /// conflict with `md` appeared or cleared since its last pass.
    pub fn clashes(&self, md: &ModelDeployment, scope: ServedNameScope) -> Vec<Clash> {
        let mds: Vec<_> = self.mds.iter().flat_map(|s| s.state()).collect();
        let adapters: Vec<_> = self.adapters.iter().flat_map(|s| s.state()).collect();
        let clashes = served_names::clashes(md, scope, &mds, &adapters);
        self.wake_changed(md, &clashes);
        clashes
    }

    fn wake_changed(&self, md: &ModelDeployment, clashes: &[Clash]) {
        let me = ObjectRef::from_obj(md);
        let now: BTreeSet<String> = clashes.iter().map(|c| c.other.clone()).collect();
        let before = self
            .last
            .lock()
            .unwrap()
            .insert(me, now.clone())
            .unwrap_or_default();
        for peer in before.symmetric_difference(&now) {
            let Some((ns, name)) = peer.split_once('/') else {
                continue;
            };
            let target = self
                .wakes
                .iter()
                .find(|(p, _)| p.as_deref().is_none_or(|p| p == ns));
            if let Some((_, wake)) = target {
                let _ = wake.unbounded_send(ObjectRef::<ModelDeployment>::new(name).within(ns));
            }
        }
    }
}
