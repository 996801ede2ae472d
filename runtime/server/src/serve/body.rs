//! Reading a request body after the caller was authenticated: at most `--max-body-bytes` (413 beyond,
//! without reading the rest) within `--body-read-timeout` (408 beyond). The handlers take the raw body
//! and call [`read`] only once the key checked out, so an unauthenticated upload is answered 401 from
//! its headers alone and costs the server one read buffer, not its size.

use super::state::BodyLimits;
use crate::api::error::{ApiError, ApiErrorKind};
use axum::body::{Body, Bytes};
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// The whole body, or the OpenAI error that says why not.
pub async fn read(body: Body, limits: BodyLimits) -> Result<Bytes, ApiError> {
    let too_large = || ApiError {
        param: Some("body".into()),
        code: Some("body_too_large".into()),
        ..ApiError::new(
            ApiErrorKind::ContextLength,
            format!(
                "the request body is larger than {} bytes (--max-body-bytes)",
                limits.max_bytes
            ),
        )
    };
    let collect = Limited::new(body, limits.max_bytes).collect();
    match tokio::time::timeout(limits.read_timeout, collect).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::invalid("body", format!("cannot read the body: {e}"))),
        Err(_) => Err(ApiError {
            param: Some("body".into()),
            ..ApiError::new(
                ApiErrorKind::RequestTimeout,
                format!(
                    "the request body did not arrive within {} s (--body-read-timeout)",
                    limits.read_timeout.as_secs_f64()
                ),
            )
        }),
    }
}
