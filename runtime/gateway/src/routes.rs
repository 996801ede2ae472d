//! The gateway's HTTP surface: the runtime's OpenAI endpoints (`POST /v1/chat/completions`,
//! `POST /v1/completions`, `GET /v1/models`) with its error shapes, the probes, and — on the metrics
//! port — `/metrics`.
//!
//! A generation request goes: edge check on the key (before the body is read) → body read with a
//! size cap and a deadline → `model` and the affinity inputs peeked → the deployment's own tenants
//! decide → the tenant's limits over the fleet ([`crate::limits`]) → [`proxy::forward`]; the
//! `x-ratelimit-*` headers go on every answer past that point.

use crate::edge::{Authorized, admit, authorize, visible};
use crate::limits::Who;
use crate::proxy::{self, Job, fail, upstream_headers};
use crate::record::Record;
use crate::request::peek;
use crate::state::Gateway;
use crate::trace;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use modelfleet_api::error::{ApiError, ApiErrorKind};
use modelfleet_api::tenants::bearer_token;
use modelfleet_crds::FallbackTrigger::FirstTokenDeadline;
use modelfleet_telemetry::genai;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

/// The API router (what clients reach).
pub fn api(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(generate))
        .route("/v1/completions", post(generate))
        .route("/v1/embeddings", post(generate))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .fallback(not_found)
        .with_state(gw)
}

/// The metrics router (what Prometheus and the operator reach).
pub fn metrics(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .with_state(gw)
}

async fn not_found() -> Response {
    ApiError::new(ApiErrorKind::NotFound, "no such endpoint").into_response()
}

async fn health() -> &'static str {
    "ok"
}

async fn ready(State(gw): State<Arc<Gateway>>) -> Response {
    if gw.draining.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    if !gw.fleet.borrow().synced {
        return (StatusCode::SERVICE_UNAVAILABLE, "watches not synced yet").into_response();
    }
    "ready".into_response()
}

async fn render_metrics(State(gw): State<Arc<Gateway>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        gw.metrics.render(),
    )
        .into_response()
}

pub(crate) fn key_of(headers: &HeaderMap) -> Option<&str> {
    bearer_token(headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()))
}

/// Reads at most `max` bytes of `body` within `within`.
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    max: usize,
    within: Duration,
) -> Result<Bytes, ApiError> {
    let too_large = || ApiError {
        code: Some("body_too_large".into()),
        param: Some("body".into()),
        ..ApiError::new(
            ApiErrorKind::ContextLength,
            format!("the request body exceeds the gateway's limit of {max} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(within, Limited::new(body, max).collect()).await {
        Err(_) => Err(ApiError::invalid(
            "body",
            format!("the request body was not received within {within:?}"),
        )),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::invalid(
            "body",
            format!("reading the request body failed: {e}"),
        )),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

async fn generate(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let arrival = Instant::now();
    let (span, trace_id) = trace::request_span(req.method().as_str(), req.uri().path(), req.headers());
    let record = Record::new(gw.metrics.clone(), arrival.into_std(), span.clone(), trace_id);
    generate_in(gw, req, arrival, record).instrument(span).await
}

async fn generate_in(gw: Arc<Gateway>, req: Request, arrival: Instant, mut record: Record) -> Response {
    let (parts, body) = req.into_parts();
    let key = key_of(&parts.headers);
    // 1. Before the body: a key that belongs to nobody in scope ends here.
    let admitted = admit(&gw.fleet.borrow().clone(), key);
    if let Err(e) = admitted {
        return fail(&mut record, e);
    }
    let s = &gw.settings;
    let body = match read_body(&parts.headers, body, s.max_body_bytes, s.body_read_timeout).await {
        Ok(b) => b,
        Err(e) => return fail(&mut record, e),
    };
    let routed = match peek(&body, s.affinity_prefix_chars) {
        Ok(r) => r,
        Err(e) => return fail(&mut record, e),
    };
    // 2. With `model` known, the deployment's own tenants decide.
    let authorized = authorize(&gw.fleet.borrow().clone(), &routed.model, key);
    let auth = match authorized {
        Ok(a) => a,
        Err(e) => return fail(&mut record, e),
    };
    let checked = auth.deployment.check_task(parts.uri.path());
    let first_token_within = match checked.and_then(|_| first_token_within(&auth, &parts.headers)) {
        Ok(w) => w,
        Err(e) => return fail(&mut record, e),
    };
    describe(&mut record, &auth, &routed);
    // 3. The tenant's limits over the fleet: refused here, a request costs the pods nothing.
    let who = Who {
        namespace: auth.deployment.id.namespace.clone(),
        deployment: auth.deployment.id.name.clone(),
        tenant: auth.tenant.id.clone(),
        model: routed.model.clone(),
    };
    let prices = auth.deployment.prices.clone();
    let lease = match gw
        .limiter
        .admit(who, &auth.tenant, prices, prompt_estimate(&body))
        .instrument(tracing::info_span!("limits"))
        .await
    {
        Ok(l) => l,
        Err(refused) => {
            let mut resp = fail(&mut record, refused.error);
            refused.headers.apply(resp.headers_mut());
            return resp;
        }
    };
    let rate = lease.headers.clone();
    let within = routed.timeout.map_or(s.request_timeout, |t| {
        s.request_timeout.min(crate::config::secs(t))
    });
    let mut headers = upstream_headers(&parts.headers);
    // The gateway tells each pod what is left of the deadline (proxy::send).
    headers.remove(modelfleet_api::deadline::HEADER);
    let job = Job {
        auth,
        routed,
        path: parts.uri.path().to_string(),
        headers,
        body,
        deadline: arrival + within,
        first_token_by: first_token_within.map(|w| arrival + w),
        arrival,
        lease,
        record,
    };
    let mut resp = proxy::forward(gw, job).await;
    // A moved request's answer carries its target's headers already (fallback::Rated).
    if resp.extensions().get::<crate::fallback::Rated>().is_none() {
        rate.apply(resp.headers_mut());
    }
    resp
}

/// Names the request's deployment, tenant and model in its record and span.
fn describe(record: &mut Record, auth: &Authorized, routed: &crate::request::Routed) {
    record.namespace = auth.deployment.id.namespace.clone();
    record.deployment = auth.deployment.id.name.clone();
    record.tenant = auth.tenant.id.clone();
    record.span.record(genai::REQUEST_MODEL, routed.model.as_str());
    record.span.record(genai::TENANT, auth.tenant.id.as_str());
    record.span.record(
        "modelfleet.deployment",
        format!("{}/{}", record.namespace, record.deployment),
    );
}

/// How long the request may go without its first token: the caller's header, or the deployment's
/// `spec.fallback.firstTokenDeadlineMilliseconds` when the request may move for it (a target takes
/// `FirstTokenDeadline`; not for an adapter, which never moves), whichever is shorter.
fn first_token_within(auth: &Authorized, headers: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let asked = modelfleet_api::deadline::from_headers(headers)?;
    let spec = auth
        .deployment
        .fallback
        .as_ref()
        .filter(|f| auth.adapter.is_none() && f.targets.iter().any(|t| t.takes(FirstTokenDeadline)))
        .and_then(|f| f.first_token_deadline_milliseconds)
        .map(|ms| Duration::from_millis(ms.max(1) as u64));
    Ok(match (asked, spec) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// Prompt tokens charged at admission, before the runtime counts them: a quarter of the body's bytes
/// (about a token per four bytes of English text; JSON around it makes it an overestimate), corrected
/// when the answer ends.
pub(crate) fn prompt_estimate(body: &[u8]) -> u64 {
    (body.len() as u64).div_ceil(4)
}

#[derive(Serialize)]
struct Card {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_model_len: Option<u64>,
}

#[derive(Serialize)]
struct CardList {
    object: &'static str,
    data: Vec<Card>,
}

/// The models and adapters the caller may use, over every deployment in scope.
async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let fleet = gw.fleet.borrow().clone();
    let key = key_of(&headers);
    if let Err(e) = admit(&fleet, key) {
        return e.into_response();
    }
    let mut data = Vec::new();
    for (d, adapters) in visible(&fleet, key) {
        if !matches!(fleet.resolve(&d.served_name), crate::fleet::Resolution::Base(_)) {
            continue; // a conflicting name is not served
        }
        let card = |id: String, parent: Option<String>| Card {
            id,
            object: "model",
            created: d.created,
            owned_by: "modelfleet",
            parent,
            max_model_len: d.max_model_len,
        };
        data.push(card(d.served_name.clone(), None));
        for a in adapters {
            if matches!(fleet.resolve(&a), crate::fleet::Resolution::Adapter(..)) {
                data.push(card(a, Some(d.served_name.clone())));
            }
        }
    }
    axum::Json(CardList { object: "list", data }).into_response()
}
