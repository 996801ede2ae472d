//! A fake runtime admin API for tests, following the contract the real one implements: bearer token
//! required (401 otherwise), `POST /v1/adapters` answers 201 when new, 200 when the same name and
//! digest are already loaded, 422 `digest_mismatch` for digests it is told are wrong; `DELETE` answers
//! 200 or 404 `adapter_not_found`; `GET` lists. It records every request, and can be told to stall.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the fake has seen and holds.
#[derive(Default)]
pub struct FakeState {
    /// Loaded adapters: name → request body.
    pub loaded: BTreeMap<String, Value>,
    /// Every request: (method, path, body).
    pub requests: Vec<(String, String, Value)>,
    /// Digests it refuses with `digest_mismatch`.
    pub bad_digests: BTreeSet<String>,
    /// How long every answer takes.
    pub delay: Duration,
}

/// A running fake; `base` is its `http://127.0.0.1:PORT`.
pub struct FakeAdmin {
    pub base: String,
    pub state: Arc<Mutex<FakeState>>,
}

pub const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

type Shared = Arc<Mutex<FakeState>>;

fn authorized(headers: &HeaderMap) -> bool {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {TOKEN}"))
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body =
        json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}});
    (status, axum::Json(body)).into_response()
}

async fn pause(st: &Shared) {
    let delay = st.lock().unwrap().delay;
    tokio::time::sleep(delay).await;
}

async fn load(State(st): State<Shared>, headers: HeaderMap, body: axum::Json<Value>) -> Response {
    st.lock()
        .unwrap()
        .requests
        .push(("POST".into(), "/v1/adapters".into(), body.0.clone()));
    pause(&st).await;
    if !authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "invalid_api_key", "bad admin token");
    }
    let mut s = st.lock().unwrap();
    let name = body["name"].as_str().unwrap_or_default().to_string();
    let digest = body["digest"].as_str().unwrap_or_default().to_string();
    if s.bad_digests.contains(&digest) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "digest_mismatch",
            &format!("expected {digest}, got sha256:beef"),
        );
    }
    let same = s.loaded.get(&name).is_some_and(|v| v["digest"] == body["digest"]);
    s.loaded.insert(name, body.0.clone());
    let status = if same { StatusCode::OK } else { StatusCode::CREATED };
    (status, axum::Json(body.0)).into_response()
}

async fn unload(State(st): State<Shared>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    st.lock()
        .unwrap()
        .requests
        .push(("DELETE".into(), format!("/v1/adapters/{name}"), Value::Null));
    pause(&st).await;
    if !authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "invalid_api_key", "bad admin token");
    }
    match st.lock().unwrap().loaded.remove(&name) {
        Some(_) => axum::Json(json!({"name": name, "deleted": true})).into_response(),
        None => error(StatusCode::NOT_FOUND, "adapter_not_found", "no such adapter"),
    }
}

async fn list(State(st): State<Shared>) -> Response {
    let data: Vec<Value> = st.lock().unwrap().loaded.values().cloned().collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

impl FakeAdmin {
    /// Starts a fake on a free loopback port.
    pub async fn start() -> FakeAdmin {
        let state: Shared = Arc::default();
        let app = Router::new()
            .route("/v1/adapters", get(list).post(load))
            .route("/v1/adapters/{name}", delete(unload))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeAdmin { base, state }
    }

    /// The (method, path) of every request so far.
    pub fn calls(&self) -> Vec<(String, String)> {
        let s = self.state.lock().unwrap();
        s.requests
            .iter()
            .map(|(m, p, _)| (m.clone(), p.clone()))
            .collect()
    }
}
