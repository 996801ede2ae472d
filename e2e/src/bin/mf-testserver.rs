//! `mf-testserver`: a small HTTP server the e2e harness runs as a pod (image `modelfleet/testserver`)
//! to prove the local control plane is real: Deployments of it scale, its pods reach Ready through
//! readiness probes, answer on their own pod IPs, and Prometheus scrapes their `/metrics`.
//!
//! Binds `$POD_IP` (else 127.0.0.1) on `$PORT` (else 8080). `GET /` names the pod; `/healthz` and
//! `/ready` answer 200; `/metrics` is Prometheus text with a request counter. Exits 0 on SIGTERM.

use axum::{Router, extract::State, routing::get};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::signal::unix::{SignalKind, signal};

struct App {
    pod: String,
    namespace: String,
    requests: AtomicU64,
}

async fn root(State(app): State<Arc<App>>) -> String {
    app.requests.fetch_add(1, Ordering::Relaxed);
    format!("hello from {}/{}\n", app.namespace, app.pod)
}

async fn metrics(State(app): State<Arc<App>>) -> String {
    format!(
        "# HELP mf_testserver_requests_total Requests to /.\n# TYPE mf_testserver_requests_total counter\n\
         mf_testserver_requests_total{{pod=\"{pod}\"}} {n}\n\
         # HELP mf_testserver_up Always 1.\n# TYPE mf_testserver_up gauge\nmf_testserver_up{{pod=\"{pod}\"}} 1\n",
        pod = app.pod,
        n = app.requests.load(Ordering::Relaxed)
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let host = std::env::var("POD_IP").unwrap_or_else(|_| "127.0.0.1".into());
    let port = std::env::var("PORT").unwrap_or_else(|_| "8080".into());
    let app = Arc::new(App {
        pod: std::env::var("POD_NAME").unwrap_or_else(|_| "unknown".into()),
        namespace: std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".into()),
        requests: AtomicU64::new(0),
    });
    let router = Router::new()
        .route("/", get(root))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/ready", get(|| async { "ready\n" }))
        .route("/metrics", get(metrics))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(format!("{host}:{port}")).await?;
    eprintln!("mf-testserver listening on {host}:{port}");
    let mut term = signal(SignalKind::terminate())?;
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            term.recv().await;
            eprintln!("mf-testserver: SIGTERM, shutting down");
        })
        .await?;
    Ok(())
}
