//! `modelfleet-gateway run`: the watches, the load scraper, and two bounded listeners (the API, and
//! `/metrics` on its own port), then a graceful drain on SIGTERM — `/ready` turns 503 at once, requests
//! are still served for `--drain-seconds` while endpoints drop this replica, then the listeners stop
//! accepting and requests in flight get `--shutdown-grace-seconds` to finish.

use crate::config::{RunArgs, secs};
use crate::fleet::Fleet;
use crate::load::scrape;
use crate::routes;
use crate::state::{Gateway, Settings};
use anyhow::Context;
use modelfleet_api::listener::{Limits, serve};
use std::collections::HashSet;
use std::net::SocketAddr;
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

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
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
    let gw = Gateway::new(
        rx,
        Settings::from_args(&args),
        args.max_pending_per_deployment,
        scrape_every,
    );
    tokio::spawn(crate::discovery::run(
        client,
        args.namespaces.clone(),
        tx,
        secs(args.secret_refresh_seconds).max(Duration::from_millis(100)),
    ));
    tokio::spawn(scrape_loop(gw.clone(), args.pod_metrics_port, scrape_every));

    let host = args
        .host
        .clone()
        .or_else(|| std::env::var("POD_IP").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "127.0.0.1".into());
    let addr: SocketAddr = format!("{host}:{}", args.port)
        .parse()
        .with_context(|| format!("--host {host}"))?;
    let metrics_addr = SocketAddr::new(addr.ip(), args.metrics_port);
    let api = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let metrics = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| format!("binding the metrics port {metrics_addr}"))?;
    tracing::info!(%addr, %metrics_addr, namespaces = ?args.namespaces, "gateway listening");
    let limits = Limits {
        max_connections: args.max_connections,
        header_read_timeout: secs(args.header_read_timeout),
        ..Limits::default()
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let api_task = tokio::spawn(serve(
        api,
        routes::api(gw.clone()),
        limits.clone(),
        stopped(stop_rx.clone()),
    ));
    let metrics_task = tokio::spawn(serve(
        metrics,
        routes::metrics(gw.clone()),
        Limits {
            max_connections: 64,
            ..limits
        },
        stopped(stop_rx),
    ));

    shutdown_signal().await;
    tracing::info!("SIGTERM: /ready is 503; still serving while endpoints drop this replica");
    gw.draining.store(true, Ordering::SeqCst);
    tokio::time::sleep(secs(args.drain_seconds)).await;
    tracing::info!("closing the listeners; requests in flight may finish");
    let _ = stop_tx.send(true);
    let grace = secs(args.shutdown_grace_seconds);
    if tokio::time::timeout(grace, async {
        let _ = api_task.await;
        let _ = metrics_task.await;
    })
    .await
    .is_err()
    {
        tracing::warn!(?grace, "requests still in flight after the grace period; exiting");
    }
    tracing::info!("stopped");
    Ok(())
}
