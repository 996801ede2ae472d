//! `GET /progress` while a fetch runs: the [`Progress`] snapshot as JSON, on the pod's admin port (the
//! runtime container takes that port only after the init container has exited). The operator polls it
//! to show bytes, rate and ETA in `status.starting` while a pod pulls its model.
//!
//! Invariants: read-only and secret-free (phase, byte counts, seconds); one route, nothing else
//! answered; a port that cannot be bound only loses the progress (logged), never the fetch.

use super::Progress;
use axum::routing::get;

/// Serves `/progress` on `addr` until the returned guard is dropped; `None` if it cannot bind.
pub async fn serve(addr: &str, progress: Progress) -> Option<Guard> {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fetch: progress endpoint not served on {addr}: {e}");
            return None;
        }
    };
    let app = axum::Router::new().route(
        "/progress",
        get(move || {
            let p = progress.clone();
            async move { axum::Json(p.snapshot()) }
        }),
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Some(Guard(task))
}

/// Stops the endpoint when dropped.
pub struct Guard(tokio::task::JoinHandle<()>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.abort();
    }
}
