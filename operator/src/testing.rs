//! Helpers for tests against a mocked API server (`tower_test`) that checks every request in order:
//! method, path (and query), and the body the test inspects. A request a scenario does not expect
//! fails the test; so does a missing one.

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

/// The test's side of the mocked API server.
pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A 404 `Status` as the API server sends it.
pub fn not_found() -> Response<Body> {
    let body =
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404});
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .body(Body::from(body.to_string().into_bytes()))
        .unwrap()
}

/// A 200 with `body`.
pub fn ok(body: &Value) -> Response<Body> {
    Response::builder()
        .body(Body::from(body.to_string().into_bytes()))
        .unwrap()
}

/// Answers with the request's own body (what an apply returns, near enough).
pub fn echo(body: &Value) -> Response<Body> {
    ok(body)
}

/// The next request as (method, uri, JSON body or null).
pub async fn next_request(
    handle: &mut Handle,
) -> Option<(
    Method,
    String,
    Value,
    tower_test::mock::SendResponse<Response<Body>>,
)> {
    let (request, send) = handle.next_request().await?;
    let method = request.method().clone();
    let uri = request.uri().to_string();
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body: Value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    };
    Some((method, uri, body, send))
}

/// One expected request: method, path (and query) prefix, and what to answer. Returns the request body.
pub async fn expect(
    handle: &mut Handle,
    method: Method,
    path: &str,
    answer: impl FnOnce(&Value) -> Response<Body>,
) -> Value {
    let (m, uri, body, send) = next_request(handle)
        .await
        .expect("the reconciler made another request");
    assert_eq!(m, method, "for {uri}");
    assert!(uri.starts_with(path), "expected {method} {path}, got {uri}");
    send.send_response(answer(&body));
    body
}

/// Serves `app` (a stand-in Prometheus HTTP API, say) on a loopback port; its base URL.
pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}
