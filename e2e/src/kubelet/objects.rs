//! Cluster-wide caches of Secrets and ConfigMaps, and a signal when any of them changes.
//!
//! Env vars, secret/configMap volumes and projected volumes read these caches instead of the API,
//! and pod workers re-materialise their volumes when the change counter moves, so a Secret
//! rotated in place reaches mounted files within a watch round trip.
//!
//! Invariants: lookups are answered only after both caches finished their initial list
//! ([`Objects::wait_ready`]), so a pod never sees "not found" for an object that exists; the change
//! counter only increases.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Keys and values of a Secret (`data`) or ConfigMap (`data` and `binaryData`).
pub type Data = BTreeMap<String, Vec<u8>>;

/// Where pods' Secrets and ConfigMaps come from (a seam for tests).
pub trait ObjectSource {
    /// The data of Secret `namespace/name`, if it exists.
    fn secret(&self, namespace: &str, name: &str) -> Option<Data>;
    /// The data of ConfigMap `namespace/name`, if it exists.
    fn config_map(&self, namespace: &str, name: &str) -> Option<Data>;
}

/// The caches, cheap to clone.
#[derive(Clone)]
pub struct Objects {
    secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
    changed: watch::Receiver<u64>,
}

impl Objects {
    /// Starts watching all Secrets and ConfigMaps; the watches stop with `shutdown`.
    pub fn start(client: &Client, shutdown: &CancellationToken) -> Objects {
        let (tx, changed) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let secrets = spawn_cache::<Secret>(Api::all(client.clone()), tx.clone(), shutdown.clone());
        let config_maps = spawn_cache::<ConfigMap>(Api::all(client.clone()), tx, shutdown.clone());
        Objects {
            secrets,
            config_maps,
            changed,
        }
    }

    /// Waits until both caches hold a complete initial list.
    pub async fn wait_ready(&self) {
        let _ = self.secrets.wait_until_ready().await;
        let _ = self.config_maps.wait_until_ready().await;
    }

    /// A receiver that sees the change counter move on every Secret or ConfigMap change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.clone()
    }
}

impl ObjectSource for Objects {
    fn secret(&self, namespace: &str, name: &str) -> Option<Data> {
        let secret = self.secrets.get(&ObjectRef::new(name).within(namespace))?;
        Some(secret_data(&secret))
    }

    fn config_map(&self, namespace: &str, name: &str) -> Option<Data> {
        let cm = self.config_maps.get(&ObjectRef::new(name).within(namespace))?;
        Some(config_map_data(&cm))
    }
}

/// A Secret's data (the API server already folded `stringData` into `data`).
pub fn secret_data(secret: &Secret) -> Data {
    let mut data = Data::new();
    for (k, v) in secret.data.iter().flatten() {
        data.insert(k.clone(), v.0.clone());
    }
    for (k, v) in secret.string_data.iter().flatten() {
        data.entry(k.clone()).or_insert_with(|| v.clone().into_bytes());
    }
    data
}

/// A ConfigMap's `data` and `binaryData` together.
pub fn config_map_data(cm: &ConfigMap) -> Data {
    let mut data = Data::new();
    for (k, v) in cm.data.iter().flatten() {
        data.insert(k.clone(), v.clone().into_bytes());
    }
    for (k, v) in cm.binary_data.iter().flatten() {
        data.insert(k.clone(), v.0.clone());
    }
    data
}

fn spawn_cache<K>(api: Api<K>, tx: Arc<watch::Sender<u64>>, shutdown: CancellationToken) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                event = stream.next() => event,
            };
            match event {
                None => return,
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) => {
                    tx.send_modify(|n| *n += 1);
                }
                Some(Ok(_)) => {}
                Some(Err(_)) if shutdown.is_cancelled() => return,
                Some(Err(e)) => tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying"),
            }
        }
    });
    reader
}

/// An in-memory [`ObjectSource`] for tests.
#[cfg(test)]
#[derive(Default)]
pub struct FakeObjects {
    /// `(namespace, name) → data` of Secrets.
    pub secrets: BTreeMap<(String, String), Data>,
    /// `(namespace, name) → data` of ConfigMaps.
    pub config_maps: BTreeMap<(String, String), Data>,
}

#[cfg(test)]
impl ObjectSource for FakeObjects {
    fn secret(&self, namespace: &str, name: &str) -> Option<Data> {
        self.secrets
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn config_map(&self, namespace: &str, name: &str) -> Option<Data> {
        self.config_maps
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
}
