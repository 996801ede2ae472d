//! Keeps the fleet snapshot current: watches ModelDeployments, LoraAdapters and runtime Pods in the
//! gateway's scope (every namespace, or those listed — one watch per kind and namespace, since RBAC
//! may grant only those), reads each referenced tenants Secret (see [`crate::secrets`]), and publishes
//! a rebuilt [`Fleet`] after every change. There are no EndpointSlices in the local cluster (their
//! validation rejects loopback addresses), so pods are found by watching Pods, as the operator does.
//!
//! Invariants: the snapshot is rebuilt from the watch caches after each batch of events, so a pod whose
//! readiness turns false or whose deletion starts leaves the rotation as soon as the watch reports it;
//! `synced` turns true only once every watch has listed its objects and the referenced Secrets were
//! read once (`/ready` waits for it).

use crate::fleet::{Fleet, build};
use crate::secrets::Secrets;
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use modelfleet_crds::{LoraAdapter, ModelDeployment};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// Pause after an event so a burst (a list, a rollout) becomes one rebuild.
const DEBOUNCE: Duration = Duration::from_millis(10);

fn apis<K>(client: &Client, namespaces: &[String]) -> Vec<Api<K>>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    }
}

/// One reflected watch per API; events become a unit tick.
fn reflect<K>(
    apis: Vec<Api<K>>,
    cfg: watcher::Config,
    streams: &mut Vec<BoxStream<'static, ()>>,
) -> Vec<Store<K>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    apis.into_iter()
        .map(|api| {
            let (reader, writer) = reflector::store();
            let kind = K::kind(&Default::default()).to_string();
            streams.push(
                watcher(api, cfg.clone())
                    .default_backoff()
                    .reflect(writer)
                    .map(move |r| {
                        if let Err(e) = r {
                            tracing::warn!(kind = %kind, error = %e, "watch failed; retrying");
                        }
                    })
                    .boxed(),
            );
            reader
        })
        .collect()
}

fn state<K: kube::Resource + Clone>(stores: &[Store<K>]) -> Vec<Arc<K>>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    stores.iter().flat_map(|s| s.state()).collect()
}

/// Watches the scope and publishes snapshots on `tx` until the process ends.
pub async fn run(
    client: Client,
    namespaces: Vec<String>,
    tx: watch::Sender<Arc<Fleet>>,
    secret_refresh: Duration,
) {
    let mut streams = Vec::new();
    let mds = reflect::<ModelDeployment>(
        apis(&client, &namespaces),
        watcher::Config::default(),
        &mut streams,
    );
    let adapters = reflect::<LoraAdapter>(
        apis(&client, &namespaces),
        watcher::Config::default(),
        &mut streams,
    );
    let pods_cfg =
        watcher::Config::default().labels(&format!("app.kubernetes.io/name={}", build::RUNTIME_APP_NAME));
    let pods = reflect::<Pod>(apis(&client, &namespaces), pods_cfg, &mut streams);

    let changed = Arc::new(Notify::new());
    let watches_synced = Arc::new(AtomicBool::new(false));
    {
        let (mds, adapters, pods) = (mds.clone(), adapters.clone(), pods.clone());
        let (changed, synced) = (changed.clone(), watches_synced.clone());
        tokio::spawn(async move {
            for s in &mds {
                let _ = s.wait_until_ready().await;
            }
            for s in &adapters {
                let _ = s.wait_until_ready().await;
            }
            for s in &pods {
                let _ = s.wait_until_ready().await;
            }
            synced.store(true, Ordering::SeqCst);
            changed.notify_one();
        });
    }
    let secrets = Secrets::new(client, changed.clone());
    {
        let (secrets, mds, synced) = (secrets.clone(), mds.clone(), watches_synced.clone());
        tokio::spawn(async move {
            secrets
                .run(
                    move || synced.load(Ordering::SeqCst).then(|| secret_refs(&state(&mds))),
                    secret_refresh,
                )
                .await
        });
    }

    let mut events = futures::stream::select_all(streams);
    loop {
        tokio::select! {
            e = events.next() => if e.is_none() { return },
            _ = changed.notified() => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        while let Some(Some(_)) = futures::FutureExt::now_or_never(events.next()) {}
        let synced = watches_synced.load(Ordering::SeqCst) && secrets.read_once();
        let previous = tx.borrow().clone();
        let next = build::fleet(
            &state(&mds),
            &state(&adapters),
            &state(&pods),
            &secrets.tables(),
            &secrets.keys(),
            &previous,
            synced,
        );
        // A Secret a new deployment references is read at once, not at the next refresh.
        if next.deployments.values().any(|d| {
            matches!(d.tenancy, crate::fleet::Tenancy::Unavailable(_))
                || d.providers.values().any(|p| p.key.is_err())
        }) {
            secrets.poke();
        }
        tx.send_replace(Arc::new(next));
    }
}

/// The Secrets the deployments reference: tenants files and providers' keys.
fn secret_refs(mds: &[Arc<ModelDeployment>]) -> crate::secrets::Refs {
    crate::secrets::Refs {
        tenants: mds.iter().filter_map(|m| build::tenants_ref(m)).collect(),
        keys: mds.iter().flat_map(|m| build::provider_key_refs(m)).collect(),
    }
}
