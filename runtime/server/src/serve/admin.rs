//! The admin listener (its own port, its own bearer token from `--admin-token-file`): the adapter API
//! of docs/design.md — `GET /v1/adapters`, `POST /v1/adapters {name, uri, digest, tenants}` (fetch, verify,
//! check against the base model, publish; 201 for a new name or generation, 200 when that name and
//! digest were already loaded), `DELETE /v1/adapters/{name}`.
//!
//! Invariants: nothing but `/metrics` and `/health` is answered without the token (compared in constant time on its SHA-256);
//! errors carry a stable `code` the operator maps to condition reasons (`digest_mismatch`,
//! `incompatible`, `invalid_artifact`, `uri_not_allowed`, `source_unavailable`, `source_timeout`,
//! `too_large`, `invalid_request`, `adapter_not_found`); the token is never logged. `GET /metrics` is
//! here too, without a token: the port is for the operator, Prometheus and the gateway, never for tenants.

use super::state::AppState;
use crate::adapters::AdapterSpec;
use crate::api::error::{ApiError, ApiErrorKind};
use crate::tenants::{bearer_token, ct_eq};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Largest admin request body.
const MAX_BODY: usize = 64 << 10;

struct Admin {
    /// SHA-256 of the token (compared in constant time); `None` refuses everything.
    token_sha256: Option<[u8; 32]>,
    st: Arc<AppState>,
}

/// The admin router.
pub fn router(st: Arc<AppState>, token: Option<String>) -> Router {
    let admin = Arc::new(Admin {
        token_sha256: token.map(|t| Sha256::digest(t.as_bytes()).into()),
        st,
    });
    Router::new()
        .route("/v1/adapters", get(list).post(load))
        .route("/v1/adapters/{name}", delete(unload))
        .route("/v1/faults/engine-panic", post(inject_panic))
        .route("/v1/faults/abort-on", post(arm_abort))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(admin.clone())
        // Prometheus text, without a token: this port is for the operator, Prometheus and the gateway,
        // never for tenants (the metrics name every tenant and adapter).
        .merge(
            Router::new()
                .route("/metrics", get(super::routes::metrics))
                .route("/health", get(super::routes::health))
                .with_state(admin.st.clone()),
        )
}

fn check(admin: &Admin, headers: &HeaderMap) -> Result<(), ApiError> {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let ok = match (admin.token_sha256, bearer_token(header)) {
        (Some(want), Some(p)) => ct_eq(&Sha256::digest(p.as_bytes()).into(), &want),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            ApiErrorKind::Authentication,
            "the admin API needs `Authorization: Bearer <admin token>`",
        ))
    }
}

async fn list(State(a): State<Arc<Admin>>, headers: HeaderMap) -> Response {
    match check(&a, &headers) {
        Ok(()) => {
            axum::Json(serde_json::json!({"object": "list", "data": a.st.adapters.list()})).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/faults/engine-panic`: makes the engine's step loop panic, as a bug would (for tests and
/// chaos drills). 404 unless the server runs with `--enable-fault-injection`.
async fn inject_panic(State(a): State<Arc<Admin>>, headers: HeaderMap) -> Result<Response, ApiError> {
    faults_allowed(&a, &headers)?;
    a.st.engine.inject_panic();
    Ok((StatusCode::ACCEPTED, "the engine will panic at its next step").into_response())
}

/// The token checked out and the server runs with `--enable-fault-injection` (else 404).
fn faults_allowed(a: &Admin, headers: &HeaderMap) -> Result<(), ApiError> {
    check(a, headers)?;
    if !a.st.fault_injection {
        return Err(ApiError::new(
            ApiErrorKind::NotFound,
            "fault injection is off (--enable-fault-injection)",
        ));
    }
    Ok(())
}

/// `POST /v1/faults/abort-on {"marker": "…"}`: the process aborts (SIGABRT, as a stack overflow would)
/// on the next request whose body contains the marker, before validating it. 404 unless the server
/// runs with `--enable-fault-injection`.
async fn arm_abort(
    State(a): State<Arc<Admin>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    faults_allowed(&a, &headers)?;
    let marker = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["marker"].as_str().map(str::to_owned))
        .filter(|m| !m.is_empty() && m.len() <= super::faults::MAX_MARKER_BYTES);
    let Some(marker) = marker else {
        return Err(ApiError::invalid(
            "marker",
            format!(
                "`marker` must be a string of 1 to {} bytes",
                super::faults::MAX_MARKER_BYTES
            ),
        ));
    };
    a.st.faults.arm_abort(&marker);
    Ok((
        StatusCode::ACCEPTED,
        "the process will abort on the next request carrying the marker",
    )
        .into_response())
}

fn parse_spec(body: &[u8]) -> Result<AdapterSpec, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| ApiError {
        code: Some("invalid_request".into()),
        ..ApiError::invalid("body", format!("the body is not valid JSON: {e}"))
    })?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = if path == "." { "body".to_string() } else { path };
        ApiError {
            code: Some("invalid_request".into()),
            ..ApiError::invalid(param.clone(), format!("`{param}`: {}", e.inner()))
        }
    })
}

async fn load(
    State(a): State<Arc<Admin>>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let run = async {
        check(&a, &headers)?;
        let body = body.map_err(|e| ApiError::invalid("body", format!("cannot read the body: {e}")))?;
        let spec = parse_spec(&body)?;
        // In its own task: a caller that gives up (a client timeout on a large download) does not
        // cancel the load; its retry gets 503 `load_in_progress` until the load ends, then 200.
        let registry = a.st.adapters.clone();
        tokio::spawn(async move { registry.load(spec).await })
            .await
            .map_err(|e| ApiError::new(ApiErrorKind::Internal, format!("the load task failed: {e}")))?
    };
    match run.await {
        Ok((created, info)) => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            (status, axum::Json(info)).into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn unload(State(a): State<Arc<Admin>>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    if let Err(e) = check(&a, &headers) {
        return e.into_response();
    }
    if a.st.adapters.unload(&name).await {
        axum::Json(serde_json::json!({"name": name, "deleted": true})).into_response()
    } else {
        ApiError {
            code: Some("adapter_not_found".into()),
            param: Some("name".into()),
            ..ApiError::new(
                ApiErrorKind::NotFound,
                format!("no adapter named `{name}` is loaded"),
            )
        }
        .into_response()
    }
}
