//! The Secrets that ModelDeployments in scope reference — tenants files, and the API keys of fallback
//! providers — read with `get` by name — the gateway
//! needs no right to list or watch Secrets, so it can read only Secrets it can name, and it names
//! only those ModelDeployments reference — every `--secret-refresh-seconds`, and at once when a new
//! deployment references one. Same file format as the runtime's mounted file (`modelfleet_api::
//! tenants`), same reload rule: a rotated key takes effect at the next read, without restarts.
//!
//! Invariants: a Secret whose new content does not parse leaves the previous keys in force (and the
//! log says why, without any key); a provider's key is kept as text and never logged; a Secret that cannot be read before it was ever read makes its
//! deployment unavailable (503), never open; Secrets no longer referenced are forgotten.

use crate::fleet::build::{KeyRead, SecretRef, TenantsRead};
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
/// A provider's key as read, with the digest of its bytes.
type KeyEntry = (KeyRead, Option<[u8; 32]>);

/// What the fleet references: tenants files and providers' API keys.
#[derive(Debug, Default)]
pub struct Refs {
    /// Tenants files.
    pub tenants: Vec<SecretRef>,
    /// Providers' API keys.
    pub keys: Vec<SecretRef>,
}

/// The tables read so far.
pub struct Secrets {
    client: Client,
    tables: Mutex<HashMap<SecretRef, Entry>>,
    keys: Mutex<HashMap<SecretRef, KeyEntry>>,
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
            keys: Mutex::default(),
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

    /// The providers' keys, by Secret key.
    pub fn keys(&self) -> HashMap<SecretRef, KeyRead> {
        self.keys
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
    pub async fn run(self: Arc<Self>, referenced: impl Fn() -> Option<Refs>, every: Duration) {
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

    /// Reads every referenced Secret; whether anything changed.
    async fn refresh(&self, refs: Refs) -> bool {
        let wanted: HashSet<SecretRef> = refs.tenants.into_iter().collect();
        let wanted_keys: HashSet<SecretRef> = refs.keys.into_iter().collect();
        let mut changed = false;
        {
            let mut tables = self.tables.lock().unwrap();
            let before = tables.len();
            tables.retain(|k, _| wanted.contains(k));
            changed |= tables.len() != before;
            let mut keys = self.keys.lock().unwrap();
            let before = keys.len();
            keys.retain(|k, _| wanted_keys.contains(k));
            changed |= keys.len() != before;
        }
        for r in wanted {
            let read = self.read(&r, "tenants").await;
            changed |= self.apply(r, read);
        }
        for r in wanted_keys {
            let read = self.read(&r, "provider key").await;
            changed |= self.apply_key(r, read);
        }
        changed
    }

    /// The bytes under a Secret's key, or why not (`what` names the Secret's use).
    async fn read(&self, r: &SecretRef, what: &str) -> Result<Vec<u8>, String> {
        let (ns, name, key) = r;
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        match api.get_opt(name).await {
            Ok(Some(s)) => {
                value(&s, key).ok_or_else(|| format!("the {what} Secret {ns}/{name} has no key {key:?}"))
            }
            Ok(None) => Err(format!("the {what} Secret {ns}/{name} does not exist")),
            Err(e) => Err(format!("the {what} Secret {ns}/{name} could not be read: {e}")),
        }
    }

    /// Records one read of a provider's key; whether it changed. A failed read keeps a key read before.
    fn apply_key(&self, r: SecretRef, read: Result<Vec<u8>, String>) -> bool {
        let mut keys = self.keys.lock().unwrap();
        let previous_ok = matches!(keys.get(&r), Some((Ok(_), _)));
        let next = match read {
            Ok(bytes) => {
                let digest: [u8; 32] = Sha256::digest(&bytes).into();
                if keys.get(&r).is_some_and(|(_, d)| *d == Some(digest)) {
                    return false;
                }
                match String::from_utf8(bytes).map(|t| t.trim().to_string()) {
                    Ok(t) if !t.is_empty() => (Ok(Arc::from(t)), Some(digest)),
                    _ => (
                        Err(format!(
                            "the provider key Secret {}/{} holds no text under {:?}",
                            r.0, r.1, r.2
                        )),
                        Some(digest),
                    ),
                }
            }
            Err(_) if previous_ok => return false,
            Err(why) => {
                if matches!(keys.get(&r), Some((Err(old), _)) if *old == why) {
                    return false;
                }
                tracing::warn!(%why, "provider key unavailable");
                (Err(why), None)
            }
        };
        keys.insert(r, next);
        true
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
