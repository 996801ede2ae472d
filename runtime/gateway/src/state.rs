//! What every handler shares: the fleet snapshot (a `watch` channel the discovery task publishes to),
//! per-pod loads, the waiting rooms, the tenant limiter, metrics, the upstream HTTP client and the settings.
//! Built from flags by `serve`, or directly by tests with a fleet they publish themselves.

use crate::config::{Routing, RunArgs, secs};
use crate::fleet::Fleet;
use crate::limits::{FailureMode, Limiter, store::Store};
use crate::load::LoadTable;
use crate::metrics::Metrics;
use crate::mirror::{MAX_IN_FLIGHT, Mirrors};
use crate::pending::Pending;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;
use tokio::sync::watch;

/// Request handling settings (from the flags).
#[derive(Clone, Debug)]
pub struct Settings {
    /// CHWBL load factor.
    pub load_factor: f64,
    /// Load under which a pod keeps its keys.
    pub load_floor: f64,
    /// Further attempts after a failure before the first byte.
    pub retries: u32,
    /// Affinity or round robin.
    pub routing: Routing,
    /// Characters of the rendered prompt in the affinity key.
    pub affinity_prefix_chars: usize,
    /// Pods' API port.
    pub pod_port: u16,
    /// Add `x-modelfleet-pod`.
    pub pod_header: bool,
    /// Largest body.
    pub max_body_bytes: usize,
    /// Time to receive a body.
    pub body_read_timeout: Duration,
    /// Arrival to first byte, at most.
    pub request_timeout: Duration,
    /// Longest hold while a deployment has no Ready pod.
    pub max_pending_wait: Duration,
    /// Longest silence from a pod mid-response.
    pub upstream_idle_timeout: Duration,
}

impl Settings {
    /// From the flags.
    pub fn from_args(a: &RunArgs) -> Settings {
        Settings {
            load_factor: a.load_factor,
            load_floor: a.load_floor,
            retries: a.retries,
            routing: a.routing,
            affinity_prefix_chars: a.affinity_prefix_chars,
            pod_port: a.pod_port,
            pod_header: a.pod_header,
            max_body_bytes: a.max_body_bytes,
            body_read_timeout: secs(a.body_read_timeout),
            request_timeout: secs(a.request_timeout),
            max_pending_wait: secs(a.max_pending_wait),
            upstream_idle_timeout: secs(a.upstream_idle_timeout),
        }
    }
}

/// Shared by every handler.
pub struct Gateway {
    /// The latest fleet snapshot.
    pub fleet: watch::Receiver<Arc<Fleet>>,
    /// Per-pod load.
    pub loads: LoadTable,
    /// Requests held while a deployment has no Ready pod.
    pub pending: Arc<Pending>,
    /// Tenant limits over the fleet.
    pub limiter: Arc<Limiter>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The client for pods (no proxy, pooled, short connect timeout).
    pub client: reqwest::Client,
    /// Settings.
    pub settings: Settings,
    /// Set on SIGTERM: `/ready` answers 503.
    pub draining: AtomicBool,
    /// Round-robin position (round-robin routing only).
    pub turn: AtomicUsize,
    /// Slots for mirrored copies (the canary's shadow step).
    pub mirrors: Mirrors,
}

/// The HTTP client for pods: loopback/cluster traffic only, so no proxy from the environment. Idle
/// connections are dropped after 30 s, well before a pod's `--idle-timeout` (120 s by default), so the
/// gateway closes them, never the pod while the gateway sends on one.
pub fn upstream_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(2))
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .http1_only()
        .build()
        .expect("an HTTP client")
}

impl Gateway {
    /// A gateway over `fleet` with `settings`, scraping each pod every `scrape_interval`, with tenant
    /// limits in this replica's memory.
    pub fn new(
        fleet: watch::Receiver<Arc<Fleet>>,
        settings: Settings,
        max_pending: usize,
        scrape_interval: Duration,
    ) -> Arc<Gateway> {
        Gateway::with_store(
            fleet,
            settings,
            max_pending,
            scrape_interval,
            Store::local(),
            FailureMode::Open,
        )
    }

    /// The same, with tenant limits in `store`, and `failure` when it cannot be reached.
    pub fn with_store(
        fleet: watch::Receiver<Arc<Fleet>>,
        settings: Settings,
        max_pending: usize,
        scrape_interval: Duration,
        store: Store,
        failure: FailureMode,
    ) -> Arc<Gateway> {
        let metrics = Arc::new(Metrics::new());
        let limiter = Limiter::new(store, failure, &metrics);
        Arc::new(Gateway {
            fleet,
            loads: LoadTable::new(scrape_interval, metrics.clone()),
            pending: Pending::new(max_pending, metrics.clone()),
            limiter,
            metrics,
            client: upstream_client(),
            settings,
            draining: AtomicBool::new(false),
            turn: AtomicUsize::new(0),
            mirrors: Mirrors::new(MAX_IN_FLIGHT),
        })
    }
}
