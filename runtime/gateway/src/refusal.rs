//! Why a request ends without an answer from a pod worth forwarding, before the first byte: what
//! [`crate::proxy::attempt`] gives back to a caller that may move the request ([`crate::fallback`]),
//! and the answer the client gets when nothing takes it.
//!
//! Invariants: a [`Refused`] request reached no pod's handler, was refused by every pod tried for
//! load, or was given up by its pod at the first-token deadline — so moving it never makes the
//! client see two answers; everything else is answered where it happened.

use crate::fleet::Pod;
use crate::proxy::{Buffered, Job, buffered_response, fail};
use crate::record::Record;
use crate::state::Gateway;
use axum::response::Response;
use modelfleet_api::error::{ApiError, ApiErrorKind};
use modelfleet_crds::FallbackTrigger;

/// Why an attempt failed before the first byte (another pod may do better).
pub(crate) enum Failure {
    /// The pod answered with an error worth retrying (kept to forward if no other pod does better).
    Answer(Buffered, Pod),
    /// The connection could not be made: the request never reached the pod.
    Transport(String),
}

/// Why a deployment could not start a request (what a fallback may take), and the request.
pub struct Refused {
    /// Why, and the answer the client gets if nothing takes the request.
    pub refusal: Refusal,
    /// The request, untouched by any pod.
    pub job: Job,
}

/// A deployment's refusal: nothing reached a pod's handler, every pod tried refused for load, or
/// the first-token deadline passed with nothing sent to the client.
pub struct Refusal {
    /// What a fallback would be moving it for.
    pub trigger: FallbackTrigger,
    pub(crate) unstarted: Unstarted,
}

pub(crate) enum Unstarted {
    /// No Ready replica before the wait ended (the 504 `no_ready_replica`).
    NoReplica(ApiError),
    /// Every pod tried refused or could not be reached (the last failure, for `model`).
    Exhausted(Option<Failure>, String),
    /// The first-token deadline passed: the pod's own 504 `first_token_deadline` (it gave the request
    /// up), or none when the gateway cut the attempt (closing the connection makes the pod cancel it)
    /// or the deadline passed before a pod was tried; with `model`.
    Late(Option<(Buffered, Pod)>, String),
}

impl Refusal {
    /// The answer for the client when nothing else takes the request.
    pub fn answer(self, gw: &Gateway, record: &mut Record) -> Response {
        match self.unstarted {
            Unstarted::NoReplica(e) => fail(record, e),
            Unstarted::Exhausted(last, model) => exhausted(gw, record, last, &model),
            Unstarted::Late(Some((b, pod)), _) => buffered_response(gw, record, b, &pod),
            Unstarted::Late(None, model) => fail(
                record,
                modelfleet_api::deadline::passed(format!(
                    "`{model}` gave no first token within the request's first-token deadline"
                )),
            ),
        }
    }
}

/// The answer when no pod did better than `last`.
pub(crate) fn exhausted(gw: &Gateway, record: &mut Record, last: Option<Failure>, model: &str) -> Response {
    match last {
        Some(Failure::Answer(b, pod)) => buffered_response(gw, record, b, &pod),
        Some(Failure::Transport(why)) => fail(
            record,
            ApiError {
                code: Some("upstream_unreachable".into()),
                ..ApiError::new(
                    ApiErrorKind::BadGateway,
                    format!("no replica of `{model}` could take the request: {why}"),
                )
            },
        ),
        None => fail(
            record,
            ApiError::new(
                ApiErrorKind::Unavailable,
                format!("`{model}` has no replica to try"),
            ),
        ),
    }
}

/// Keeps the failure to report if no pod does better: a pod's own answer (it says why, e.g. draining or
/// a full queue, with `Retry-After`) over a connection failure, else the latest.
pub(crate) fn remember(last: &mut Option<Failure>, f: Failure) {
    if matches!(f, Failure::Transport(_)) && matches!(last, Some(Failure::Answer(..))) {
        return;
    }
    *last = Some(f);
}

/// What the client hears when the pod its request was on went away: not retried.
pub(crate) fn went_away(model: &str, pod: &Pod, why: &str) -> ApiError {
    ApiError {
        code: Some("upstream_failed".into()),
        ..ApiError::new(
            ApiErrorKind::BadGateway,
            format!(
                "the replica of `{model}` handling this request ({}) went away before answering ({why}); \
                 the request was not sent to another replica, since it may be what made this one fail",
                pod.name
            ),
        )
    }
}

pub(crate) fn broken_twice(model: &str, why: &str) -> ApiError {
    ApiError {
        code: Some("upstream_failed".into()),
        ..ApiError::new(
            ApiErrorKind::BadGateway,
            format!(
                "connections to two replicas of `{model}` broke before an answer ({why}); not retried again"
            ),
        )
    }
}

pub(crate) fn timeout(model: &str) -> ApiError {
    ApiError::new(
        ApiErrorKind::Timeout,
        format!("`{model}` did not start answering before the request's deadline"),
    )
}
