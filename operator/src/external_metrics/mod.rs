//! The operator as an `external.metrics.k8s.io/v1beta1` provider, so a plain HorizontalPodAutoscaler
//! (autoscaling/v2, `type: External`) scales a ModelDeployment in `autoscaling.mode: External` on the
//! fleet's own signals — requests waiting, requests running, KV-cache utilisation — with no metrics
//! adapter or Prometheus in between (docs/autoscaling.md, "External autoscalers").
//!
//! The chart registers an APIService for the group that points at the operator's Service; every
//! operator replica serves it (leader or not: it only reads). [`api`] is the wire format, [`tls`] who
//! may connect (the API server's front proxy), [`serve`] the listener. This module starts it and
//! keeps its TLS configuration current: the serving certificate from files (a mounted Secret) and
//! the front proxy's CA from `kube-system/extension-apiserver-authentication`, re-read every minute.
//!
//! Invariants: nothing here writes to the API — the HPA writes `spec.replicas` through `/scale`, the
//! reconciler follows it; a metric is a fresh read of the deployment's Ready pods (the same bounded
//! scrape the built-in autoscaler does), never a cached or partial figure.

pub mod api;
pub mod serve;
#[cfg(test)]
mod test_pki;
pub mod tls;

use crate::autoscaler::metrics::scrape_direct;
use crate::labels::METRICS_PORT;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use serve::{Reader, Tls};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Where the provider listens and what it presents.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The address (`0.0.0.0:6443`, or `$POD_IP:6443`).
    pub bind: SocketAddr,
    /// The serving certificate (PEM; the chain, leaf first).
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
}

/// How often the TLS configuration is read again (certificate rotation, a new front-proxy CA).
const REFRESH: Duration = Duration::from_secs(60);

/// Binds, then serves until the process ends; the TLS configuration follows its sources.
pub async fn run(client: kube::Client, http: reqwest::Client, settings: Settings) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(settings.bind).await?;
    tracing::info!(bind = %settings.bind, "serving external.metrics.k8s.io/v1beta1");
    let tls: Tls = Arc::new(RwLock::new(None));
    tokio::spawn(refresh(client.clone(), settings, tls.clone()));
    serve::serve(listener, tls, serve::router(pod_reader(client, http))).await;
    Ok(())
}

/// Reads the sources every [`REFRESH`] and installs a new configuration when they changed.
async fn refresh(client: kube::Client, settings: Settings, tls: Tls) {
    let mut last: Option<(Vec<u8>, Vec<u8>, tls::FrontProxy)> = None;
    loop {
        match sources(&client, &settings).await {
            Ok(now) if last.as_ref() != Some(&now) => match tls::server_config(&now.0, &now.1, &now.2) {
                Ok(config) => {
                    tracing::info!(allowed = ?now.2.allowed_names, "external metrics: TLS configuration loaded");
                    *tls.write().unwrap_or_else(|e| e.into_inner()) = Some((Arc::new(config), now.2.clone()));
                    last = Some(now);
                }
                Err(e) => tracing::error!(error = %e, "external metrics: cannot build the TLS configuration"),
            },
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "external metrics: cannot read the TLS configuration"),
        }
        tokio::time::sleep(REFRESH).await;
    }
}

/// The serving certificate, its key, and the front proxy.
async fn sources(
    client: &kube::Client,
    settings: &Settings,
) -> Result<(Vec<u8>, Vec<u8>, tls::FrontProxy), String> {
    let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let (cert, key) = (read(&settings.cert_file)?, read(&settings.key_file)?);
    let (ns, name) = tls::AUTH_CONFIGMAP;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| format!("{ns}/{name}: {e}"))?;
    let proxy = tls::FrontProxy::from_data(&cm.data.unwrap_or_default())?;
    Ok((cert, key, proxy))
}

/// The [`Reader`] of the cluster: the Ready pods `selector` names, scraped on their metrics port.
pub fn pod_reader(client: kube::Client, http: reqwest::Client) -> Reader {
    Arc::new(move |ns: String, selector: String| {
        let (client, http) = (client.clone(), http.clone());
        Box::pin(async move {
            let pods = Api::<Pod>::namespaced(client, &ns)
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| format!("listing pods {selector:?} in {ns}: {e}"))?;
            let ips: Vec<String> = pods
                .items
                .iter()
                .filter(|p| modelfleet_crds::pods::is_ready(p))
                .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
                .collect();
            scrape_direct(&http, &ips, METRICS_PORT).await
        })
    })
}
