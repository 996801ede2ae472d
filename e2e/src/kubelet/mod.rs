//! `mf-kubelet`: a process kubelet for end-to-end tests against a real control plane.
//!
//! It plays two roles of a one-node cluster. As **scheduler** it binds pending pods to its node.
//! As **kubelet** it registers the Node, heartbeats it, and runs every pod bound to it: containers
//! are local processes (one process group each) on the pod's own loopback IP (127.1.x.y), volumes
//! are directories under the pod's directory, absolute mount paths in commands, args and env are
//! rewritten to those directories, and each pod gets a kubeconfig with a TokenRequest token of its
//! ServiceAccount, so RBAC applies for real.
//!
//! Code map:
//! - [`config`]: flags → [`config::KubeletConfig`].
//! - [`node`]: Node registration, heartbeats, Lease. [`scheduler`]: binding.
//! - [`manager`]: pod watch → one [`pod`] worker per pod UID.
//! - [`pod`]: the worker (sandbox, containers, probes, status, termination).
//! - [`objects`]: Secret/ConfigMap caches. [`images`]: image map. [`ipam`]: pod IPs.
//! - [`rewrite`], [`expand`], [`quantity`]: pure helpers. [`apiserver`]: pods' API access.
//! - [`events`]: core Events. [`cleanup`]: leftovers of a previous run. [`context`]: shared state.
//!
//! Invariants: everything is driven by watches and deadlines (no polling loops); each pod has
//! exactly one owner task; a malformed pod yields a status message, never a crash; when the
//! kubelet exits (SIGTERM/SIGINT) every process it started is stopped first.
//!
//! Limits of the harness (by design): processes cannot mount, so only paths that appear in the
//! command, args, literal env values, working dir and exec probes are rewritten — a program that
//! hard-codes a mount path it was not given does not see the volume; processes that bind 0.0.0.0
//! share the host's ports (bind `$POD_IP`); no network isolation, cgroups, resource limits,
//! users, image pulls, `kubectl logs/exec/port-forward` (logs are files under the state dir), no
//! service env vars beyond `KUBERNETES_SERVICE_*`, no preStop/postStart hooks, no PVCs, HTTPS/gRPC
//! probes, ephemeral containers, readiness gates or in-place resize.

pub mod apiserver;
pub mod cleanup;
pub mod config;
pub mod context;
pub mod error;
pub mod events;
pub mod expand;
pub mod images;
pub mod ipam;
pub mod manager;
pub mod node;
pub mod objects;
pub mod pod;
pub mod quantity;
pub mod rewrite;
pub mod scheduler;

use std::sync::{Arc, Mutex};

use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio_util::sync::CancellationToken;

pub use self::config::{Args, KubeletConfig};
pub use self::error::{Error, Result};

/// Runs the kubelet until `shutdown` is cancelled; returns after every pod was stopped.
pub async fn run(config: KubeletConfig, shutdown: CancellationToken) -> Result<()> {
    let kubeconfig = Kubeconfig::read_from(&config.kubeconfig)?;
    let api = apiserver::ApiAccess::from_kubeconfig(
        &kubeconfig,
        config.apiserver_url.as_deref(),
        config.ca_file.as_deref(),
    )?;
    let client_config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = kube::Client::try_from(client_config)?;
    let images = images::ImageSource::load(&config.images)?;
    cleanup::stale_pods(&config.state_dir);

    let background = CancellationToken::new();
    let objects = objects::Objects::start(&client, &background);
    let ctx = Arc::new(context::Ctx {
        events: events::EventSink::new(client.clone(), &config.node_name),
        node: pod::NodeResources::detect(&config.state_dir),
        ipam: Mutex::new(ipam::Ipam::new(config.ip_range)),
        path_env: std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
        client,
        images,
        api,
        objects,
        config,
    });
    register_with_retries(&ctx, &shutdown).await?;
    tokio::spawn(node::heartbeat(ctx.clone(), background.clone()));
    if ctx.config.schedule {
        let labels = node::labels(&ctx.config.node_name);
        tokio::spawn(scheduler::run(ctx.clone(), labels, background.clone()));
    }
    tokio::select! {
        _ = shutdown.cancelled() => {
            background.cancel();
            return Ok(());
        }
        _ = ctx.objects.wait_ready() => {}
    }
    tracing::info!(node = %ctx.config.node_name, "secret and configmap caches synced; running pods");
    manager::run(ctx.clone(), shutdown).await;
    background.cancel();
    Ok(())
}

/// Registers the Node, retrying for up to a minute while the API server comes up.
async fn register_with_retries(ctx: &context::Ctx, shutdown: &CancellationToken) -> Result<()> {
    let mut attempt = 0;
    loop {
        match node::register(ctx).await {
            Ok(()) => return Ok(()),
            Err(e) if attempt < 60 && !shutdown.is_cancelled() => {
                tracing::warn!(error = %e, "node registration failed; retrying");
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}
