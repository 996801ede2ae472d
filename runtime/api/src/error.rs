//! The one mapping from failures to HTTP: OpenAI's error shape `{"error": {message, type, param, code}}`
//! with the status codes of docs/design.md, for JSON answers and SSE streams alike.
//!
//! Invariants: bad input is never a 500; messages name the field and the limit; a 429 always carries
//! `Retry-After`; nothing secret (keys, file contents) is ever put in a message.

use serde::Serialize;

/// Why a request failed, in the categories clients act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiErrorKind {
    /// 400: malformed or out-of-range input, or a feature not supported yet.
    InvalidRequest,
    /// 401: no or unknown API key.
    Authentication,
    /// 403: the tenant may not use this model or adapter.
    PermissionDenied,
    /// 404: unknown model.
    NotFound,
    /// 413: prompt plus `max_tokens` exceed the context.
    ContextLength,
    /// 429: queue or quota full; retry after the given seconds.
    RateLimited {
        /// Seconds the client should wait.
        retry_after_secs: u32,
    },
    /// 422: well-formed, but the artifact it names cannot be used (admin API: digest mismatch,
    /// an adapter that does not fit the base model).
    Unprocessable,
    /// 502: an upstream source failed (admin API: the adapter could not be downloaded).
    BadGateway,
    /// 503: not ready, or shutting down.
    Unavailable,
    /// 504: the deadline passed before the first token.
    Timeout,
    /// 408: the client did not send its request body in time.
    RequestTimeout,
    /// 500: a bug or an engine failure (never for bad input).
    Internal,
}

/// An API error: what went wrong, which parameter, and a stable code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The category (decides the HTTP status).
    pub kind: ApiErrorKind,
    /// A sentence naming the field and the limit.
    pub message: String,
    /// The offending parameter, when there is one.
    pub param: Option<String>,
    /// A stable machine-readable code (e.g. `unsupported_parameter`).
    pub code: Option<String>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    type_: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            kind: ApiErrorKind::InvalidRequest,
            message: message.into(),
            param: Some(param.into()),
            code: Some("invalid_value".into()),
        }
    }

    /// A 400 for a parameter modelfleet does not know or does not support yet.
    pub fn unsupported(param: &str, why: &str) -> ApiError {
        ApiError {
            kind: ApiErrorKind::InvalidRequest,
            message: format!("`{param}` is {why}"),
            param: Some(param.into()),
            code: Some("unsupported_parameter".into()),
        }
    }

    /// An error of `kind` with a message and no parameter.
    pub fn new(kind: ApiErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        match self.kind {
            ApiErrorKind::InvalidRequest => 400,
            ApiErrorKind::Authentication => 401,
            ApiErrorKind::PermissionDenied => 403,
            ApiErrorKind::NotFound => 404,
            ApiErrorKind::ContextLength => 413,
            ApiErrorKind::RateLimited { .. } => 429,
            ApiErrorKind::Unprocessable => 422,
            ApiErrorKind::BadGateway => 502,
            ApiErrorKind::Unavailable => 503,
            ApiErrorKind::Timeout => 504,
            ApiErrorKind::RequestTimeout => 408,
            ApiErrorKind::Internal => 500,
        }
    }

    /// OpenAI's `type` string.
    pub fn type_str(&self) -> &'static str {
        match self.kind {
            ApiErrorKind::InvalidRequest | ApiErrorKind::ContextLength | ApiErrorKind::Unprocessable => {
                "invalid_request_error"
            }
            ApiErrorKind::BadGateway => "upstream_error",
            ApiErrorKind::Authentication => "authentication_error",
            ApiErrorKind::PermissionDenied => "permission_error",
            ApiErrorKind::NotFound => "not_found_error",
            ApiErrorKind::RateLimited { .. } => "rate_limit_error",
            ApiErrorKind::Unavailable => "service_unavailable_error",
            ApiErrorKind::Timeout | ApiErrorKind::RequestTimeout => "timeout_error",
            ApiErrorKind::Internal => "internal_error",
        }
    }

    /// `Retry-After` seconds, for 429s.
    pub fn retry_after(&self) -> Option<u32> {
        match self.kind {
            ApiErrorKind::RateLimited { retry_after_secs } => Some(retry_after_secs),
            _ => None,
        }
    }

    /// The JSON body (also what an SSE stream sends as `data:` before `[DONE]` when it fails midway).
    pub fn body(&self) -> String {
        serde_json::to_string(&Body {
            error: Inner {
                message: &self.message,
                type_: self.type_str(),
                param: self.param.as_deref(),
                code: self.code.as_deref(),
            },
        })
        .expect("an error body always serialises")
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        let status = axum::http::StatusCode::from_u16(self.status())
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.body(),
        )
            .into_response();
        if let Some(secs) = self.retry_after() {
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_shapes() {
        let cases = [
            (
                ApiError::invalid("top_p", "top_p must be in (0, 1], got 1.5"),
                400,
                "invalid_request_error",
            ),
            (
                ApiError::new(ApiErrorKind::Authentication, "missing API key"),
                401,
                "authentication_error",
            ),
            (
                ApiError::new(ApiErrorKind::PermissionDenied, "no"),
                403,
                "permission_error",
            ),
            (
                ApiError::new(ApiErrorKind::NotFound, "no model x"),
                404,
                "not_found_error",
            ),
            (
                ApiError::new(ApiErrorKind::ContextLength, "too long"),
                413,
                "invalid_request_error",
            ),
            (
                ApiError::new(ApiErrorKind::RateLimited { retry_after_secs: 2 }, "queue full"),
                429,
                "rate_limit_error",
            ),
            (
                ApiError::new(ApiErrorKind::Unavailable, "shutting down"),
                503,
                "service_unavailable_error",
            ),
            (
                ApiError::new(ApiErrorKind::Timeout, "deadline"),
                504,
                "timeout_error",
            ),
        ];
        for (e, status, type_) in cases {
            assert_eq!(e.status(), status);
            let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
            assert_eq!(v["error"]["type"], type_);
            assert_eq!(v["error"]["message"], e.message.as_str());
            assert_eq!(v.as_object().unwrap().len(), 1);
        }
        let e = ApiError::unsupported("tools", "not supported yet");
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v["error"]["param"], "tools");
        assert_eq!(v["error"]["code"], "unsupported_parameter");
        assert_eq!(
            ApiError::new(ApiErrorKind::RateLimited { retry_after_secs: 3 }, "x").retry_after(),
            Some(3)
        );
    }
}
