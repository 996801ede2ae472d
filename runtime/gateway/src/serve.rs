//! `modelfleet-gateway run`: the watches, the load scraper, and two bounded listeners (the API, and
//! `/metrics` on its own port), then a graceful drain on SIGTERM — `/ready` turns 503 at once, requests
//! are still served for `--drain-seconds` while endpoints drop this replica, then the listeners stop
//! accepting and requests in flight get `--shutdown-grace-seconds` to finish.

use crate::config::{RunArgs, secs};
use crate::fleet::Fleet;
use crate::limits::store::Store;
use crate::load::scrape;
use crate::routes;
use crate::state::{Gateway, Settings};
use anyhow::Context;
use modelfleet_api::listener::{Limits, Listeners, host_or_pod_ip, shutdown_signal};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::watch;

/// Scrapes every Ready pod's load every `every` (a pod refusing the connection is ejected).
pub async fn scrape_loop(gw: Arc<Gateway>, port: u16, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let fleet = gw.fleet.borrow().clone();
        let pods: Vec<crate::fleet::Pod> = fleet
            .deployments
            .values()
            .flat_map(|d| d.pods.iter().cloned())
            .collect();
        gw.loads
            .retain(&pods.iter().map(|p| p.name.as_str()).collect::<HashSet<_>>());
        let timeout = every.mul_f64(0.8);
        futures::future::join_all(pods.iter().map(|p| {
            let gw = gw.clone();
            async move {
                match scrape(&gw.client, &p.ip, port, timeout).await {
                    Ok(s) => gw.loads.scraped(&p.name, s),
                    Err(true) => gw.loads.eject(&p.name),
                    Err(false) => {}
                }
            }
        }))
        .await;
    }
}

/// Runs the gateway until SIGTERM.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .context("a Kubernetes client (in-cluster, or KUBECONFIG)")?;
    let (tx, rx) = watch::channel(Arc::new(Fleet::default()));
    let scrape_every = Duration::from_millis(args.scrape_interval_ms.max(100));
    let store = match &args.limits_store {
        Some(url) => Store::redis(url, Duration::from_millis(args.limits_store_timeout_ms.max(1)))
            .map_err(anyhow::Error::msg)?,
        None => Store::local(),
    };
    let gw = Gateway::with_store(
        rx,
        Settings::from_args(&args),
        args.max_pending_per_deployment,
        scrape_every,
        store,
        args.limits_failure_mode,
    );
    tracing::info!(
        shared = gw.limiter.shared,
        failure_mode = ?args.limits_failure_mode,
        "tenant limits store"
    );
    tokio::spawn(crate::discovery::run(
        client,
        args.namespaces.clone(),
        tx,
        secs(args.secret_refresh_seconds).max(Duration::from_millis(100)),
    ));
    tokio::spawn(scrape_loop(gw.clone(), args.pod_metrics_port, scrape_every));

    let host = host_or_pod_ip(args.host.as_deref());
    let listeners = Listeners::bind(&host, args.port, args.metrics_port, "the metrics port").await?;
    tracing::info!(addr = %listeners.addr, metrics_addr = %listeners.second_addr, namespaces = ?args.namespaces, "gateway listening");
    let limits = Limits {
        max_connections: args.max_connections,
        header_read_timeout: secs(args.header_read_timeout),
        idle_timeout: secs(args.idle_timeout),
        ..Limits::default()
    };
    let metrics_limits = Limits {
        max_connections: 64,
        ..limits.clone()
    };
    let serving = listeners.serve(
        (routes::api(gw.clone()), limits),
        (routes::metrics(gw.clone()), metrics_limits),
    );

    shutdown_signal().await;
    tracing::info!("SIGTERM: /ready is 503; still serving while endpoints drop this replica");
    gw.draining.store(true, Ordering::SeqCst);
    serving.drain();
    tokio::time::sleep(secs(args.drain_seconds)).await;
    tracing::info!("closing the listeners; requests in flight may finish");
    let grace = secs(args.shutdown_grace_seconds);
    if !serving.stop(grace).await {
        tracing::warn!(?grace, "requests still in flight after the grace period; exiting");
    }
    tracing::info!("stopped");
    Ok(())
}
