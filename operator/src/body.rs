//! Reading HTTP answers the operator did not write (runtime pods' `/metrics` and admin API, Prometheus):
//! never more than a cap, never longer than the request's timeout.
//!
//! Invariant: every response body the operator reads goes through [`read_capped`]; each request also
//! carries a `timeout` (reqwest's covers connecting, the headers and the whole body), so a pod or a
//! Prometheus that streams forever or stalls costs one bounded read, not the operator's memory or a
//! reconcile that never ends.

/// Most bytes read from a pod's `/metrics` (a pod with many tenants and adapters stays far below).
pub const MAX_METRICS_BYTES: usize = 8 << 20;
/// Most bytes read from one Prometheus query answer.
pub const MAX_PROMETHEUS_BYTES: usize = 8 << 20;
/// Most bytes read from an admin API error answer (only its `error.code` and message are used).
pub const MAX_ADMIN_BYTES: usize = 64 << 10;

/// The body of `resp`, or an error once it passes `max` bytes (`Content-Length` is checked first).
pub async fn read_capped(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    if let Some(len) = resp.content_length()
        && len > max as u64
    {
        return Err(format!("answer of {len} bytes is over the {max}-byte limit"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("reading the answer: {}", e.without_url()))?
    {
        if body.len() + chunk.len() > max {
            return Err(format!("answer is over the {max}-byte limit"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, Bytes};
    use std::time::{Duration, Instant};

    /// A server whose `/endless` never ends its body and whose `/stall` never sends one.
    async fn server() -> String {
        let endless = || async {
            let chunks =
                futures::stream::repeat_with(|| Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 4096])));
            Body::from_stream(chunks)
        };
        let stall =
            || async { Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>()) };
        let app = axum::Router::new()
            .route("/endless", axum::routing::get(endless))
            .route("/stall", axum::routing::get(stall))
            .route("/small", axum::routing::get(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn bodies_are_capped_and_time_limited() {
        let base = server().await;
        let http = crate::autoscaler::metrics::http_client();
        let get = |path: &str| {
            http.get(format!("{base}{path}"))
                .timeout(Duration::from_millis(500))
                .send()
        };
        assert_eq!(
            read_capped(get("/small").await.unwrap(), 16).await.unwrap(),
            b"ok"
        );
        let e = read_capped(get("/endless").await.unwrap(), 1 << 20)
            .await
            .unwrap_err();
        assert!(e.contains("over the 1048576-byte limit"), "{e}");
        let t0 = Instant::now();
        let e = read_capped(get("/stall").await.unwrap(), 1 << 20)
            .await
            .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(3), "{e}");
    }
}
