//! `mf-kubelet`: the process kubelet of modelfleet's local end-to-end cluster.
//! See `modelfleet_e2e::kubelet` for what it does and its limits.

use std::io::IsTerminal;

use clap::Parser;
use modelfleet_e2e::kubelet::{self, Args};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let config = Args::parse().into_config()?;
    let shutdown = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutting down: stopping every pod");
        trigger.cancel();
    });
    kubelet::run(config, shutdown).await?;
    Ok(())
}
