//! The adapter registry: which adapters this runtime serves, under which names and digests, for which
//! tenants, and which are resident in memory.
//!
//! Lifecycle: `load` (admin API or start-up file) fetches into the digest-keyed store, verifies the
//! canonical digest, checks the adapter against the base model, then publishes it under its name —
//! the same name with a new digest is a new generation: requests already holding the old one finish
//! on it, new requests get the new one (the prefix cache keys blocks by the digest, so generations
//! never share blocks). `unload` removes the name; in-flight requests keep their weights.
//!
//! Residency: at most `max_cpu_loras` adapters have their weights in memory. A request for one that
//! is not resident reloads it (re-verifying the digest on disk first), evicting the least recently
//! used resident adapter that no request holds; when every resident adapter is in use the request
//! waits (until its deadline), it does not fail.
//!
//! Invariants: an adapter's weights are in memory only after its bytes matched the digest (at load
//! and again at every reload); an adapter held by a request (an `Arc` in the engine's `Request`) is
//! never evicted — eviction requires the registry's to be the only reference; the registry's lock is
//! held for bookkeeping only, never across I/O (only placing a fetched directory into the store is
//! serialized, off the async runtime); loads of different names run side by side, so one slow source
//! never holds up another adapter.

use super::metrics::LoraMetrics;
use super::spec::{AdapterSpec, CheckedSpec, UriPolicy};
use crate::api::error::{ApiError, ApiErrorKind};
use crate::fetch::{FetchError, FetchRequest};
use modelfleet_engine::lora::{AdapterIdentity, LoraAdapter};
use modelfleet_engine::model::ModelConfig;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Registry settings (serve flags).
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// Adapters kept in memory (`--max-cpu-loras`).
    pub max_cpu_loras: usize,
    /// Largest rank accepted (`--max-lora-rank`).
    pub max_lora_rank: usize,
    /// Most adapters registered at once (resident or not).
    pub max_adapters: usize,
    /// Most requests waiting for an adapter to be loaded into memory at once; more get 429
    /// (`--max-num-queued-reqs`: such waits are queueing too, and queues are bounded).
    pub max_waiting: usize,
    /// The digest-keyed store fetched adapters live in (`--adapter-dir`).
    pub store: PathBuf,
    /// Where adapters may come from.
    pub policy: UriPolicy,
    /// Hugging Face endpoint for `hf://`.
    pub hf_endpoint: String,
    /// Bearer token (`HF_TOKEN`; never logged), sent only to `hf_endpoint`'s origin.
    pub token: Option<String>,
    /// Byte and time limits of one adapter's fetch (`--max-adapter-bytes`,
    /// `--adapter-fetch-timeout-seconds`).
    pub fetch_limits: crate::fetch::Limits,
}

/// How a request's `model` resolves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelChoice {
    /// The base model.
    Base,
    /// An adapter, by served name.
    Adapter(String),
}

/// An adapter as `GET /v1/adapters` shows it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct AdapterInfo {
    /// Served name.
    pub name: String,
    /// Where it came from.
    pub uri: String,
    /// Its verified digest.
    pub digest: String,
    /// Tenants allowed (empty: all).
    pub tenants: Vec<String>,
    /// `loaded` (in memory), `evicted` (verified on disk; reloads on demand) or `failed`.
    pub state: &'static str,
    /// Requests holding it now.
    pub refs: usize,
    /// Last request for it (Unix seconds).
    pub last_used: Option<u64>,
    /// When this generation was loaded (Unix seconds).
    pub loaded_at: Option<u64>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

struct Entry {
    spec: AdapterSpec,
    dir: PathBuf,
    loaded_at: SystemTime,
    weights: Option<Arc<LoraAdapter>>,
    /// A reload is running (in a detached task, so a caller that goes away cannot wedge it).
    loading: bool,
    last_used: Option<SystemTime>,
    /// A reload failed for good (e.g. the bytes on disk no longer match the digest).
    broken: Option<String>,
}

impl Entry {
    fn refs(&self) -> usize {
        self.weights.as_ref().map_or(0, |w| Arc::strong_count(w) - 1)
    }
}

#[derive(Default)]
struct Inner {
    live: BTreeMap<String, Entry>,
    /// Start-up entries that could not be loaded: (spec, message).
    failed: BTreeMap<String, (AdapterSpec, String)>,
}

/// The registry (one per server).
pub struct Registry {
    cfg: RegistryConfig,
    base: ModelConfig,
    base_name: String,
    inner: Mutex<Inner>,
    /// Names being loaded now (a second load of one of them is refused while the first runs; loads
    /// of different names run side by side, so one slow source never holds up the others).
    loading: Mutex<std::collections::HashSet<String>>,
    /// Serializes placing fetched directories into the store.
    place: Arc<Mutex<()>>,
    metrics: Arc<LoraMetrics>,
    /// Requests now waiting in `acquire`.
    waiting: std::sync::atomic::AtomicUsize,
}

/// Marks a name as being loaded until dropped.
pub(crate) struct Loading<'a> {
    registry: &'a Registry,
    name: String,
}

impl<'a> Loading<'a> {
    pub(crate) fn enter(registry: &'a Registry, name: &str) -> Result<Self, ApiError> {
        let mut names = registry.loading.lock().unwrap_or_else(|e| e.into_inner());
        if !names.insert(name.to_owned()) {
            return Err(adapter_error(
                ApiErrorKind::Unavailable,
                "load_in_progress",
                format!("the adapter `{name}` is being loaded by another call; retry when it ends"),
            ));
        }
        Ok(Self {
            registry,
            name: name.to_owned(),
        })
    }
}

impl Drop for Loading<'_> {
    fn drop(&mut self) {
        let mut names = self.registry.loading.lock().unwrap_or_else(|e| e.into_inner());
        names.remove(&self.name);
    }
}

/// Counts a request as waiting in `acquire` until dropped.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How long a request waiting for a resident slot sleeps between looks.
const WAIT_STEP: Duration = Duration::from_millis(10);

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn adapter_error(kind: ApiErrorKind, code: &str, message: String) -> ApiError {
    ApiError {
        code: Some(code.into()),
        ..ApiError::new(kind, message)
    }
}

/// The admin API's answer to a failed fetch.
fn fetch_error(e: FetchError) -> ApiError {
    let (kind, code) = match &e {
        FetchError::InvalidArgument(_) => (ApiErrorKind::InvalidRequest, "invalid_request"),
        FetchError::SourceUnavailable(_) => (ApiErrorKind::BadGateway, "source_unavailable"),
        FetchError::DigestMismatch { .. } => (ApiErrorKind::Unprocessable, "digest_mismatch"),
        FetchError::InvalidArtifact(_) | FetchError::Malformed(_) => {
            (ApiErrorKind::Unprocessable, "invalid_artifact")
        }
        FetchError::Unauthorized(_) => (ApiErrorKind::BadGateway, "source_unauthorized"),
        FetchError::Signature { .. } => (ApiErrorKind::Unprocessable, "signature_invalid"),
        FetchError::Io { .. } => (ApiErrorKind::Internal, "local_io_error"),
        FetchError::TooLarge(_) => (ApiErrorKind::Unprocessable, "too_large"),
        FetchError::TimedOut(_) => (ApiErrorKind::Timeout, "source_timeout"),
    };
    adapter_error(kind, code, e.to_string())
}

impl Registry {
    /// An empty registry for a base model `base` served as `base_name`.
    pub fn new(cfg: RegistryConfig, base: ModelConfig, base_name: String, metrics: Arc<LoraMetrics>) -> Self {
        Self {
            cfg,
            base,
            base_name,
            inner: Mutex::new(Inner::default()),
            loading: Default::default(),
            place: Arc::new(Mutex::new(())),
            metrics,
            waiting: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The settings.
    pub fn config(&self) -> &RegistryConfig {
        &self.cfg
    }

    /// The metrics.
    pub fn metrics(&self) -> &LoraMetrics {
        &self.metrics
    }

    /// Resolves `model` for `tenant`: the base, an adapter it may use, or 404 — for an adapter the
    /// tenant may not use exactly as for one that does not exist, so no tenant learns another's
    /// adapter names.
    pub fn resolve(&self, model: &str, tenant: &str) -> Result<ModelChoice, ApiError> {
        if model == self.base_name {
            return Ok(ModelChoice::Base);
        }
        let inner = self.lock();
        match inner.live.get(model) {
            Some(e) if allowed(&e.spec, tenant) => Ok(ModelChoice::Adapter(model.to_owned())),
            _ => Err(ApiError {
                param: Some("model".into()),
                code: Some("model_not_found".into()),
                ..ApiError::new(
                    ApiErrorKind::NotFound,
                    format!(
                        "the model `{model}` does not exist here; this server serves `{}` and its adapters (GET /v1/models)",
                        self.base_name
                    ),
                )
            }),
        }
    }

    /// Adapter names `tenant` may use, sorted.
    pub fn visible(&self, tenant: &str) -> Vec<String> {
        let inner = self.lock();
        inner
            .live
            .iter()
            .filter(|(_, e)| allowed(&e.spec, tenant))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Every registered adapter name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.lock().live.keys().cloned().collect()
    }

    /// The weights of adapter `name` for a request of `tenant`, reloading them if they were evicted;
    /// waits for a resident slot until `deadline` if every slot is in use.
    pub async fn acquire(
        self: &Arc<Self>,
        name: &str,
        tenant: &str,
        deadline: Instant,
    ) -> Result<Arc<LoraAdapter>, ApiError> {
        let mut waiting: Option<Waiting<'_>> = None;
        loop {
            let reload = {
                let mut inner = self.lock();
                let max = self.cfg.max_cpu_loras;
                // Unloaded (or its tenants changed) since `resolve`: answer as `resolve` would, after
                // letting go of the lock it takes.
                if !inner.live.get(name).is_some_and(|e| allowed(&e.spec, tenant)) {
                    drop(inner);
                    return Err(self.resolve(name, tenant).err().unwrap_or_else(|| {
                        ApiError::new(
                            ApiErrorKind::Unavailable,
                            format!("the adapter `{name}` changed while this request waited; retry"),
                        )
                    }));
                }
                let e = inner.live.get_mut(name).expect("checked above");
                if let Some(why) = &e.broken {
                    return Err(adapter_error(
                        ApiErrorKind::Unavailable,
                        "adapter_unavailable",
                        format!("the adapter `{name}` cannot be loaded: {why}"),
                    ));
                }
                e.last_used = Some(SystemTime::now());
                if let Some(w) = &e.weights {
                    return Ok(w.clone());
                }
                if e.loading {
                    None
                } else if resident(&inner) < max || evict_one(&mut inner, &self.metrics, name) {
                    let e = inner.live.get_mut(name).expect("checked above");
                    e.loading = true;
                    Some((e.dir.clone(), e.spec.clone()))
                } else {
                    None
                }
            };
            if let Some((dir, spec)) = reload {
                let me = self.clone();
                tokio::spawn(async move { me.reload(dir, spec).await });
            }
            if waiting.is_none() {
                // About to wait: bounded like every queue here.
                let n = self.waiting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                waiting = Some(Waiting(&self.waiting));
                if n >= self.cfg.max_waiting {
                    return Err(ApiError {
                        code: Some("adapter_queue_full".into()),
                        ..ApiError::new(
                            ApiErrorKind::RateLimited { retry_after_secs: 1 },
                            format!(
                                "{n} requests already wait for adapters to be loaded into memory (the limit); retry shortly"
                            ),
                        )
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(adapter_error(
                    ApiErrorKind::Timeout,
                    "adapter_wait_timeout",
                    format!(
                        "the request's deadline passed while the adapter `{name}` waited for one of the {} memory slots (--max-cpu-loras)",
                        self.cfg.max_cpu_loras
                    ),
                ));
            }
            tokio::time::sleep(WAIT_STEP).await;
        }
    }

    /// Reloads an evicted adapter from the store (re-verifying its digest) and publishes it, unless
    /// the name now points at another generation.
    async fn reload(&self, dir: PathBuf, spec: AdapterSpec) {
        let t0 = Instant::now();
        let result = self.read(dir, &spec).await;
        let mut inner = self.lock();
        let Some(e) = inner
            .live
            .get_mut(&spec.name)
            .filter(|e| e.spec.digest == spec.digest)
        else {
            return;
        };
        e.loading = false;
        match result {
            Ok(w) => {
                e.weights = Some(Arc::new(w));
                self.metrics.loaded(&spec.name, t0.elapsed());
            }
            Err(err) => {
                tracing::warn!(adapter = %spec.name, error = %err.message, "adapter reload failed");
                e.broken = Some(err.message);
            }
        }
    }

    /// Verifies `dir` against the spec's digest and reads the adapter (blocking work off the runtime).
    async fn read(&self, dir: PathBuf, spec: &AdapterSpec) -> Result<LoraAdapter, ApiError> {
        let (base, rank) = (self.base.clone(), self.cfg.max_lora_rank);
        let (uri, identity) = (
            spec.uri.clone(),
            AdapterIdentity {
                name: spec.name.clone(),
                digest: spec.digest.clone(),
            },
        );
        tokio::task::spawn_blocking(move || {
            crate::fetch::verify(&dir, &identity.digest, &uri).map_err(fetch_error)?;
            LoraAdapter::load(&dir, &base, rank, identity)
                .map_err(|e| adapter_error(ApiErrorKind::Unprocessable, "incompatible", e.to_string()))
        })
        .await
        .map_err(|e| {
            adapter_error(
                ApiErrorKind::Internal,
                "internal",
                format!("loading task failed: {e}"),
            )
        })?
    }

    /// Fetches, verifies, checks and publishes an adapter. `Ok(true)` when it is a new name or a new
    /// generation, `Ok(false)` when this name and digest were already loaded (its tenants updated).
    pub async fn load(&self, spec: AdapterSpec) -> Result<(bool, AdapterInfo), ApiError> {
        let source = spec.validate(&self.base_name, &self.cfg.policy)?;
        let _loading = Loading::enter(self, &spec.name)?;
        let t0 = Instant::now();
        {
            let mut inner = self.lock();
            if let Some(e) = inner.live.get_mut(&spec.name)
                && e.spec.digest == spec.digest
                && e.broken.is_none()
            {
                e.spec.tenants = spec.tenants.clone();
                e.spec.uri = spec.uri.clone();
                let info = info(&spec.name, e);
                return Ok((false, info));
            }
            if !inner.live.contains_key(&spec.name) && inner.live.len() >= self.cfg.max_adapters {
                return Err(adapter_error(
                    ApiErrorKind::Unprocessable,
                    "too_many_adapters",
                    format!(
                        "this runtime already has {} adapters registered, its limit; unload one first",
                        self.cfg.max_adapters
                    ),
                ));
            }
        }
        // The source itself must hold bytes with this digest, even when the store already has them
        // (under another name): a caller's claim "this URI has this digest" is always checked.
        let dir = self.cfg.store.join(spec.digest.trim_start_matches("sha256:"));
        let incoming = crate::fetch::stage::unique_dir(&self.cfg.store, ".incoming-").map_err(fetch_error)?;
        let req = FetchRequest {
            limits: self.cfg.fetch_limits,
            access: crate::fetch::Access {
                hf_endpoint: self.cfg.hf_endpoint.clone(),
                hf_token: self.cfg.token.clone(),
                ..crate::fetch::Access::default()
            },
            ..FetchRequest::new(source, spec.digest.clone(), incoming.clone())
        };
        let fetched = crate::fetch::fetch(&req).await.map_err(fetch_error);
        let (d, inc, digest) = (dir.clone(), incoming.clone(), spec.digest.clone());
        let lock = self.place.clone();
        let place = move || -> Result<(), ApiError> {
            let (dir, incoming) = (d, inc);
            let _placing = lock.lock().unwrap_or_else(|e| e.into_inner());
            if crate::fetch::stage::dest_holds(&dir, &digest) {
                let _ = std::fs::remove_dir_all(&incoming);
                Ok(())
            } else {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::rename(&incoming, &dir).map_err(|e| {
                    adapter_error(
                        ApiErrorKind::Internal,
                        "local_io_error",
                        format!("placing the adapter in {}: {e}", dir.display()),
                    )
                })
            }
        };
        let placed = match fetched {
            Ok(_) => tokio::task::spawn_blocking(place).await.unwrap_or_else(|e| {
                Err(adapter_error(
                    ApiErrorKind::Internal,
                    "internal",
                    format!("placing task failed: {e}"),
                ))
            }),
            Err(e) => Err(e),
        };
        if let Err(e) = placed {
            let _ = std::fs::remove_dir_all(&incoming);
            return Err(e);
        }
        let weights = match self.read(dir.clone(), &spec).await {
            Ok(w) => w,
            Err(e) => {
                self.remove_dir_unless_used(&dir);
                return Err(e);
            }
        };
        let mut inner = self.lock();
        let name = spec.name.clone();
        // The generation it replaces gives up its slot; otherwise it needs a free or evictable one,
        // and without one it is registered evicted (it loads on first use).
        let keep = inner.live.get(&name).is_some_and(|e| e.weights.is_some())
            || resident(&inner) < self.cfg.max_cpu_loras
            || evict_one(&mut inner, &self.metrics, &name);
        let entry = Entry {
            spec,
            dir: dir.clone(),
            loaded_at: SystemTime::now(),
            weights: keep.then(|| Arc::new(weights)),
            loading: false,
            last_used: None,
            broken: None,
        };
        let info = info(&name, &entry);
        let old = inner.live.insert(name.clone(), entry);
        inner.failed.remove(&name);
        drop(inner);
        if let Some(old) = old
            && old.dir != dir
        {
            self.remove_dir_unless_used(&old.dir);
        }
        self.metrics.loaded(&name, t0.elapsed());
        tracing::info!(adapter = %name, digest = %info.digest, "adapter loaded");
        Ok((true, info))
    }

    /// Records a start-up entry that could not be loaded (listed by `GET /v1/adapters` as `failed`).
    pub fn record_failure(&self, spec: AdapterSpec, message: String) {
        let mut inner = self.lock();
        if !inner.live.contains_key(&spec.name) {
            inner.failed.insert(spec.name.clone(), (spec, message));
        }
    }

    /// Records a start-up entry as failed with `message` unless its name is registered or already
    /// recorded; `true` if it was recorded now (the start-up deadline passed while it loads).
    pub fn fail_if_pending(&self, spec: &AdapterSpec, message: String) -> bool {
        let mut inner = self.lock();
        if inner.live.contains_key(&spec.name) || inner.failed.contains_key(&spec.name) {
            return false;
        }
        inner.failed.insert(spec.name.clone(), (spec.clone(), message));
        true
    }

    /// Whether a failed start-up entry should still be retried: it is still listed as failed with this
    /// digest (the admin API neither unloaded nor replaced it, and nothing loaded that name since).
    pub fn retry_wanted(&self, spec: &AdapterSpec) -> bool {
        let inner = self.lock();
        !inner.live.contains_key(&spec.name)
            && inner
                .failed
                .get(&spec.name)
                .is_some_and(|(s, _)| s.digest == spec.digest)
    }

    /// Removes adapter `name`; requests already holding it finish on it. `false` if it was unknown.
    pub async fn unload(&self, name: &str) -> bool {
        let mut inner = self.lock();
        let was_failed = inner.failed.remove(name).is_some();
        let Some(old) = inner.live.remove(name) else {
            return was_failed;
        };
        drop(inner);
        self.remove_dir_unless_used(&old.dir);
        tracing::info!(adapter = %name, "adapter unloaded");
        true
    }

    /// Deletes a store directory no registered adapter uses.
    fn remove_dir_unless_used(&self, dir: &Path) {
        let used = self.lock().live.values().any(|e| e.dir == dir);
        if !used {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// Every adapter, sorted by name.
    pub fn list(&self) -> Vec<AdapterInfo> {
        let inner = self.lock();
        let mut out: Vec<AdapterInfo> = inner.live.iter().map(|(n, e)| info(n, e)).collect();
        out.extend(inner.failed.iter().map(|(n, (spec, message))| AdapterInfo {
            name: n.clone(),
            uri: spec.uri.clone(),
            digest: spec.digest.clone(),
            tenants: spec.tenants.clone(),
            state: "failed",
            refs: 0,
            last_used: None,
            loaded_at: None,
            message: Some(message.clone()),
        }));
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Adapters with weights in memory.
    pub fn resident(&self) -> usize {
        resident(&self.lock())
    }
}

fn allowed(spec: &AdapterSpec, tenant: &str) -> bool {
    spec.tenants.is_empty() || spec.tenants.iter().any(|t| t == tenant)
}

fn resident(inner: &Inner) -> usize {
    inner.live.values().filter(|e| e.weights.is_some()).count()
}

/// Drops the weights of the least recently used resident adapter no request holds (other than
/// `except`); `false` if there is none.
fn evict_one(inner: &mut Inner, metrics: &LoraMetrics, except: &str) -> bool {
    let victim = inner
        .live
        .iter()
        .filter(|(n, e)| n.as_str() != except && e.weights.is_some() && e.refs() == 0)
        .min_by_key(|(_, e)| e.last_used.unwrap_or(e.loaded_at))
        .map(|(n, _)| n.clone());
    match victim {
        Some(n) => {
            let e = inner.live.get_mut(&n).expect("victim exists");
            e.weights = None;
            metrics.evicted(&n);
            true
        }
        None => false,
    }
}

fn info(name: &str, e: &Entry) -> AdapterInfo {
    AdapterInfo {
        name: name.to_owned(),
        uri: e.spec.uri.clone(),
        digest: e.spec.digest.clone(),
        tenants: e.spec.tenants.clone(),
        state: if e.broken.is_some() {
            "failed"
        } else if e.weights.is_some() {
            "loaded"
        } else {
            "evicted"
        },
        refs: e.refs(),
        last_used: e.last_used.map(unix),
        loaded_at: Some(unix(e.loaded_at)),
        message: e.broken.clone(),
    }
}
