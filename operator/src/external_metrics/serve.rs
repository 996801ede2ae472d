//! The listener and its routes: TLS with the front proxy's client certificate required ([`super::tls`]),
//! HTTP/1.1, and two routes — discovery, and a metric's value for one ModelDeployment's Ready pods,
//! read fresh on every request (one bounded scrape per pod) through a [`Reader`].
//!
//! Invariants: a metric is answered only when every Ready pod of the deployment answered (otherwise
//! 503, and the HPA holds its count — missing metrics never scale down); no Ready pod is 503 too,
//! never a zero; connections are bounded in number and in the time a handshake may take.

use super::api::{self, Metric};
use super::tls::FrontProxy;
use crate::autoscaler::metrics::{PodMetrics, aggregate};
use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;

/// Reads the metrics of the Ready pods `selector` names in namespace `ns` (empty: none is Ready).
pub type Reader =
    Arc<dyn Fn(String, String) -> BoxFuture<'static, Result<Vec<PodMetrics>, String>> + Send + Sync>;

/// The TLS configuration in force and the front proxy it admits (`None` until both are known).
pub type Tls = Arc<RwLock<Option<(Arc<ServerConfig>, FrontProxy)>>>;

/// Most connections served at once (the API server keeps a few).
const MAX_CONNECTIONS: usize = 64;
/// Longest a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The routes of `external.metrics.k8s.io/v1beta1`.
pub fn router(reader: Reader) -> Router {
    Router::new()
        .route(
            "/apis/external.metrics.k8s.io/v1beta1",
            get(|| async { Json(api::discovery()) }),
        )
        .route(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}",
            get(metric),
        )
        .fallback(|| async {
            let body = api::status(
                404,
                "NotFound",
                "not served here (external.metrics.k8s.io/v1beta1 only)",
            );
            (StatusCode::NOT_FOUND, Json(body))
        })
        .with_state(reader)
}

async fn metric(
    State(reader): State<Reader>,
    Path((ns, name)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> (StatusCode, Json<Value>) {
    let fail = |code: StatusCode, reason: &str, message: String| {
        (code, Json(api::status(code.as_u16(), reason, &message)))
    };
    let Some(metric) = Metric::named(&name) else {
        let served: Vec<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
        let message = format!("no external metric {name:?} (served: {})", served.join(", "));
        return fail(StatusCode::NOT_FOUND, "NotFound", message);
    };
    let (selector, deployment) = match api::pod_selector(query.get("labelSelector").map(String::as_str)) {
        Ok(s) => s,
        Err(e) => return fail(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    let pods = match reader(ns.clone(), selector).await {
        Ok(pods) => pods,
        Err(e) => return fail(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", e),
    };
    let Some(sample) = aggregate(&pods) else {
        let message = format!("ModelDeployment {ns}/{deployment} has no Ready replica to read {name} from");
        return fail(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", message);
    };
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let list = api::value_list(metric, metric.of(&sample), &deployment, &now);
    (StatusCode::OK, Json(list))
}

/// Serves `router` on `listener` to clients `tls` admits, until the process ends.
pub async fn serve(listener: TcpListener, tls: Tls, router: Router) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "external metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "external metrics: too many connections; closing one");
            continue;
        };
        let current = tls.read().unwrap_or_else(|e| e.into_inner()).clone();
        let Some((config, proxy)) = current else {
            tracing::warn!(%peer, "external metrics: no TLS configuration yet (the front proxy's CA is unknown)");
            continue;
        };
        let router = router.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(tcp, config, &proxy, router).await {
                tracing::info!(%peer, error = %e, "external metrics: connection refused");
            }
            drop(slot);
        });
    }
}

/// One connection: the handshake, the client's name, then HTTP/1.1 until it closes.
async fn connection(
    tcp: tokio::net::TcpStream,
    config: Arc<ServerConfig>,
    proxy: &FrontProxy,
    router: Router,
) -> Result<(), String> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
        .await
        .map_err(|_| "TLS handshake timed out".to_string())?
        .map_err(|e| format!("TLS handshake: {e}"))?;
    let cert = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no client certificate")?;
    if !proxy.allows(cert) {
        let name = super::tls::common_name(cert).unwrap_or_default();
        return Err(format!(
            "client certificate {name:?} is not among requestheader-allowed-names {:?}",
            proxy.allowed_names
        ));
    }
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router))
        .await
        .map_err(|e| format!("HTTP: {e}"))
}

#[cfg(test)]
mod tests;
