//! The tenants Secrets that ModelDeployments in scope reference, read with `get` by name — the gateway
//! needs no right to list or watch Secrets, so it can read only Secrets it can name, and it names
//! only those ModelDeployments reference — every `--secret-refresh-seconds`, and at once when a new
//! deployment references one. Same file format as the runtime's mounted file (`modelfleet_api::
//! tenants`), same reload rule: a rotated key takes effect at the next read, without restarts.
//!
//! Invariants: a Secret whose new content does not parse leaves the previous keys in force (and the
//! log says why, without any key); a Secret that cannot be read before it was ever read makes its
//! deployment unavailable (503), never open; Secrets no longer referenced are forgotten.

use crate::fleet::build::{SecretRef, TenantsRead};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use modelfleet_api::tenants::Tenants;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// A table as read, with the digest of the bytes it came from (to skip unchanged reads).
type Entry = (TenantsRead, Option<[u8; 32]>);

/// The tables read so far.
pub struct Secrets {
    client: Client,
    tables: Mutex<HashMap<SecretRef, Entry>>,
    read_once: AtomicBool,
    /// Wakes the discovery loop to rebuild the fleet.
    changed: Arc<Notify>,
    /// Wakes the refresh loop early.
    wake: Notify,
}

/// What a Secret holds under `key`, if anything.
fn value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.0.clone());
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|s| s.as_bytes().to_vec())
}

impl Secrets {
    /// Nothing read yet; `changed` is notified whenever a table changes.
    pub fn new(client: Client, changed: Arc<Notify>) -> Arc<Secrets> {
        Arc::new(Secrets {
            client,
            tables: Mutex::default(),
            read_once: AtomicBool::new(false),
            changed,
            wake: Notify::new(),
        })
    }

    /// The tables, by Secret key.
    pub fn tables(&self) -> HashMap<SecretRef, TenantsRead> {
        self.tables
            .lock()
            .unwrap()
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect()
    }

    /// Whether every referenced Secret was read at least once.
    pub fn read_once(&self) -> bool {
        self.read_once.load(Ordering::SeqCst)
    }

    /// Reads the Secrets now rather than at the next refresh.
    pub fn poke(&self) {
        self.wake.notify_one();
    }

    /// Reads the Secrets `referenced` names (None: the watches have not synced yet) every `every`.
    pub async fn run(self: Arc<Self>, referenced: impl Fn() -> Option<Vec<SecretRef>>, every: Duration) {
        loop {
            if let Some(refs) = referenced() {
                let changed = self.refresh(refs).await;
                let first = !self.read_once.swap(true, Ordering::SeqCst);
                if changed || first {
                    self.changed.notify_one();
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    /// Reads every referenced Secret; whether any table changed.
    async fn refresh(&self, refs: Vec<SecretRef>) -> bool {
        let wanted: HashSet<SecretRef> = refs.into_iter().collect();
        let mut changed = false;
        {
            let mut tables = self.tables.lock().unwrap();
            let before = tables.len();
            tables.retain(|k, _| wanted.contains(k));
            changed |= tables.len() != before;
        }
        for r in wanted {
            let (ns, name, key) = &r;
            let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
            let read = match api.get_opt(name).await {
                Ok(Some(s)) => match value(&s, key) {
                    Some(bytes) => Ok(bytes),
                    None => Err(format!("the tenants Secret {ns}/{name} has no key {key:?}")),
                },
                Ok(None) => Err(format!("the tenants Secret {ns}/{name} does not exist")),
                Err(e) => Err(format!("the tenants Secret {ns}/{name} could not be read: {e}")),
            };
            changed |= self.apply(r.clone(), read);
        }
        changed
    }

    /// Records one read; whether the table changed.
    fn apply(&self, r: SecretRef, read: Result<Vec<u8>, String>) -> bool {
        let mut tables = self.tables.lock().unwrap();
        let previous_ok = matches!(tables.get(&r), Some((Ok(_), _)));
        let next = match read {
            Ok(bytes) => {
                let digest: [u8; 32] = Sha256::digest(&bytes).into();
                if tables.get(&r).is_some_and(|(_, d)| *d == Some(digest)) {
                    return false;
                }
                match std::str::from_utf8(&bytes)
                    .map_err(|e| e.to_string())
                    .and_then(|t| Tenants::parse(t).map_err(|e| e.to_string()))
                {
                    Ok(t) => {
                        tracing::info!(secret = %format!("{}/{}", r.0, r.1), tenants = t.all().len(), "tenants read");
                        (Ok(Arc::new(t)), Some(digest))
                    }
                    Err(e) if previous_ok => {
                        tracing::warn!(secret = %format!("{}/{}", r.0, r.1), error = %e, "keeping the previous keys: the new tenants file is invalid");
                        let (t, _) = tables.remove(&r).expect("previous");
                        (t, Some(digest))
                    }
                    Err(e) => (
                        Err(format!("the tenants Secret {}/{} is invalid: {e}", r.0, r.1)),
                        Some(digest),
                    ),
                }
            }
            // A read that failed keeps keys that were read before (the API server may be restarting).
            Err(_) if previous_ok => return false,
            Err(why) => {
                if matches!(tables.get(&r), Some((Err(old), _)) if *old == why) {
                    return false;
                }
                tracing::warn!(%why, "tenants unavailable");
                (Err(why), None)
            }
        };
        tables.insert(r, next);
        true
    }
}
