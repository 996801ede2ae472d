//! The first-token deadline: how long a request may go without its first token before the fleet
//! gives up on the deployment serving it. The gateway sets it from the ModelDeployment's
//! `spec.fallback.firstTokenDeadlineMilliseconds` (a caller may lower it with the header below) and
//! passes what is left of it to the runtime pod in the same header; the pod ends a request that has
//! not sampled its first token by then, answering 504 with code [`CODE`] before a byte of the
//! answer was sent — which tells the gateway the request may move (docs/gateway.md, "Fallbacks").
//!
//! Invariants: the header only ever shortens a deadline; a value that is not a whole number of
//! milliseconds in `1..=`[`MAX_MS`] is refused with a 400 naming the header.

use crate::error::ApiError;
use std::time::Duration;

/// The request header: milliseconds from the request's arrival.
pub const HEADER: &str = "x-modelfleet-first-token-deadline-ms";
/// The error code of an answer refused because the deadline passed before the first token.
pub const CODE: &str = "first_token_deadline";
/// The longest deadline accepted (10 minutes).
pub const MAX_MS: u64 = 600_000;

/// The header's value, if the request carries one.
pub fn from_headers(headers: &http::HeaderMap) -> Result<Option<Duration>, ApiError> {
    let Some(v) = headers.get(HEADER) else {
        return Ok(None);
    };
    let ms = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|ms| (1..=MAX_MS).contains(ms));
    match ms {
        Some(ms) => Ok(Some(Duration::from_millis(ms))),
        None => Err(ApiError::invalid(
            HEADER,
            format!("the `{HEADER}` header must be a whole number of milliseconds in 1..={MAX_MS}"),
        )),
    }
}

/// The answer for a request whose first token did not come in time (`message` says how long it was).
pub fn passed(message: impl Into<String>) -> ApiError {
    ApiError {
        code: Some(CODE.into()),
        ..ApiError::new(crate::error::ApiErrorKind::Timeout, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(v: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(HEADER, v.parse().unwrap());
        h
    }

    #[test]
    fn the_header_is_a_bounded_whole_number_of_milliseconds() {
        assert_eq!(from_headers(&http::HeaderMap::new()).unwrap(), None);
        assert_eq!(
            from_headers(&with("1500")).unwrap(),
            Some(Duration::from_millis(1500))
        );
        for bad in ["0", "-1", "1.5", "600001", "soon", ""] {
            let e = from_headers(&with(bad)).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}");
            assert!(
                e.message.contains(HEADER) && e.message.contains("600000"),
                "{bad}: {}",
                e.message
            );
        }
        let e = passed("no first token in 1000 ms");
        assert_eq!((e.status(), e.code.as_deref()), (504, Some(CODE)));
    }
}
