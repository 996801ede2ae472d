//! The admin listener (its own port, its own bearer token from `--admin-token-file`): the adapter API
//! of DESIGN.md. Multi-LoRA is not built yet, so the list is empty and loading is refused with 501
//! naming that; the listener, its authentication and its health endpoint are real.

use super::state::AppState;
use crate::api::error::{ApiError, ApiErrorKind};
use crate::tenants::{bearer_token, ct_eq};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use sha2::{Digest, Sha256};
use std::sync::Arc;

struct Admin {
    /// SHA-256 of the token (compared in constant time); `None` refuses everything.
    token_sha256: Option<[u8; 32]>,
    _st: Arc<AppState>,
}

/// The admin router.
pub fn router(st: Arc<AppState>, token: Option<String>) -> Router {
    let admin = Arc::new(Admin {
        token_sha256: token.map(|t| Sha256::digest(t.as_bytes()).into()),
        _st: st,
    });
    Router::new()
        .route("/v1/adapters", get(list).post(load))
        .route("/v1/adapters/{name}", delete(unload))
        .route("/health", get(|| async { "ok" }))
        .with_state(admin)
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
        Ok(()) => axum::Json(serde_json::json!({"object": "list", "data": []})).into_response(),
        Err(e) => e.into_response(),
    }
}

fn not_built() -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        serde_json::json!({"error": {
            "message": "LoRA adapters are not supported by this runtime version yet",
            "type": "not_implemented", "param": null, "code": "adapters_not_supported"}})
        .to_string(),
    )
        .into_response()
}

async fn load(State(a): State<Arc<Admin>>, headers: HeaderMap) -> Response {
    match check(&a, &headers) {
        Ok(()) => not_built(),
        Err(e) => e.into_response(),
    }
}

async fn unload(State(a): State<Arc<Admin>>, headers: HeaderMap, Path(_name): Path<String>) -> Response {
    match check(&a, &headers) {
        Ok(()) => not_built(),
        Err(e) => e.into_response(),
    }
}
