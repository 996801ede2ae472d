//! An embedding model's routers and handlers: `POST /v1/embeddings` (parse, tokenize on the blocking
//! pool, check every input against the model's limits, admit, wait for the step loop, answer in
//! OpenAI's shape), `/v1/models`, `/health`, `/ready`; the admin port's `/metrics` and `/health`.
//!
//! Invariants: a request is checked whole before it is admitted (a 400 names `input` with the item and
//! the limit, or `dimensions`); admitted requests are answered or time out with a 504 — the step loop
//! never runs a request whose client has gone; every answered request is counted and logged as one
//! usage line without its text.

use super::EmbedState;
use super::worker::Job;
use crate::api::embeddings::{
    Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, EmbeddingVector, EncodingFormat, Input,
    base64_f32,
};
use crate::api::error::{ApiError, ApiErrorKind};
use crate::api::limits::{USAGE_HEADER, usage_report};
use crate::api::response::{ModelCard, ModelList};
use crate::tenants::Tenant;
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use modelfleet_engine::sched::TenantLimits;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The API router.
pub fn api(st: Arc<EmbedState>, max_body_bytes: usize) -> Router {
    Router::new()
        .route(
            "/v1/embeddings",
            post(embeddings).layer(axum::middleware::from_fn(crate::serve::trace::traced)),
        )
        .route("/v1/chat/completions", post(generation))
        .route("/v1/completions", post(generation))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .fallback(|| async { ApiError::new(ApiErrorKind::NotFound, "no such endpoint").into_response() })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(st)
}

/// The admin router: Prometheus text and liveness, without a token (this port is never for tenants).
pub fn admin(st: Arc<EmbedState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .with_state(st)
}

fn authenticate(st: &EmbedState, headers: &HeaderMap) -> Result<Arc<Tenant>, ApiError> {
    super::super::state::authenticate(&st.auth, headers)
}

async fn health() -> Response {
    "ok".into_response()
}

async fn ready(State(st): State<Arc<EmbedState>>) -> Response {
    if st.draining.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    "ready".into_response()
}

async fn metrics(State(st): State<Arc<EmbedState>>) -> Response {
    let m = &st.metrics;
    let name = st.served_name.as_str();
    m.requests_waiting
        .with_label_values(&[name])
        .set(st.worker.gate.queued().0 as i64);
    m.requests_running
        .with_label_values(&[name])
        .set(st.worker.running.load(Ordering::Relaxed) as i64);
    m.kv_cache_usage_ratio.with_label_values(&[name]).set(0.0);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        m.render(),
    )
        .into_response()
}

async fn models(State(st): State<Arc<EmbedState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authenticate(&st, &headers) {
        return e.into_response();
    }
    let card = ModelCard {
        id: st.served_name.clone(),
        object: "model",
        created: st.created,
        owned_by: "modelfleet",
        parent: None,
        max_model_len: st.model.max_input_tokens,
    };
    axum::Json(ModelList {
        object: "list",
        data: vec![card],
    })
    .into_response()
}

async fn generation(State(st): State<Arc<EmbedState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authenticate(&st, &headers) {
        return e.into_response();
    }
    ApiError::invalid(
        "model",
        format!(
            "`{}` is an embedding model: it answers /v1/embeddings, not chat or completions",
            st.served_name
        ),
    )
    .into_response()
}

async fn embeddings(State(st): State<Arc<EmbedState>>, headers: HeaderMap, raw: Body) -> Response {
    let arrival = Instant::now();
    let run = async {
        let tenant = authenticate(&st, &headers)?;
        if st.draining.load(Ordering::SeqCst) {
            return Err(ApiError::new(
                ApiErrorKind::Unavailable,
                "the server is shutting down; retry on another replica",
            ));
        }
        st.worker.gate.precheck().map_err(|r| reject(&st, &tenant, &r))?;
        let req: EmbeddingRequest =
            super::super::routes::parse(&super::super::body::read(raw, st.body).await?)?;
        answer(&st, &tenant, req, arrival).await
    };
    match run.await {
        // The exact usage, for the gateway's limits and usage records (always sent: it is cheap and
        // holds nothing a tenant may not see).
        Ok(r) => {
            let report = usage_report(r.usage.prompt_tokens as u64, 0, 0);
            ([(USAGE_HEADER, report)], axum::Json(r)).into_response()
        }
        Err(e) => e.into_response(),
    }
}

fn reject(st: &EmbedState, tenant: &Tenant, r: &modelfleet_engine::sched::Rejection) -> ApiError {
    st.metrics
        .requests_rejected
        .with_label_values(&[&st.served_name, &tenant.id, r.label()])
        .inc();
    super::super::generate::rejection_error(r)
}

async fn answer(
    st: &Arc<EmbedState>,
    tenant: &Arc<Tenant>,
    req: EmbeddingRequest,
    arrival: Instant,
) -> Result<EmbeddingResponse, ApiError> {
    if req.model != st.served_name {
        return Err(ApiError::new(
            ApiErrorKind::NotFound,
            format!("the model `{}` does not exist", req.model),
        ));
    }
    let info = &st.model;
    let dims = check_dimensions(info, req.dimensions)?;
    let inputs = tokenize(st, &req).await?;
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    if tokens > st.max_queued_tokens {
        return Err(ApiError::invalid(
            "input",
            format!(
                "`input` holds {tokens} tokens; one request may hold at most {} (--max-num-queued-tokens)",
                st.max_queued_tokens
            ),
        ));
    }
    let quota = TenantLimits {
        max_concurrent_requests: tenant.max_concurrent_requests.map(|v| v as usize),
        max_queued_tokens: tenant.max_queued_tokens.map(|v| v as usize),
        max_queued_requests: Some(st.tenant_queue_share),
    };
    st.worker
        .gate
        .try_enter(&tenant.id, tokens, quota)
        .map_err(|r| reject(st, tenant, &r))?;
    let (reply, answer) = tokio::sync::oneshot::channel();
    st.worker.submit(Job {
        tenant: tenant.id.clone(),
        inputs,
        tokens,
        reply,
    });
    let done = match tokio::time::timeout(st.max_timeout, answer).await {
        Err(_) => {
            return Err(ApiError::new(
                ApiErrorKind::Timeout,
                "the embeddings were not ready within the server's time limit",
            ));
        }
        Ok(Err(_)) => {
            return Err(ApiError::new(
                ApiErrorKind::Internal,
                "the embedding loop stopped",
            ));
        }
        Ok(Ok(Err(why))) => return Err(ApiError::new(ApiErrorKind::Internal, why)),
        Ok(Ok(Ok(done))) => done,
    };
    record(st, &tenant.id, tokens, arrival, done.first_scheduled);
    let format = req.encoding_format.unwrap_or_default();
    let data = done
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| embedding(index, v, dims, info.normalize, format))
        .collect();
    Ok(EmbeddingResponse {
        object: "list",
        data,
        model: st.served_name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    })
}

/// One embedding as answered: cut to `dims` (normalised again when the model normalises) and encoded.
fn embedding(
    index: usize,
    mut v: Vec<f32>,
    dims: usize,
    normalize: bool,
    format: EncodingFormat,
) -> Embedding {
    if dims < v.len() {
        v.truncate(dims);
        if normalize {
            let n = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt() as f32;
            v.iter_mut().for_each(|x| *x /= n.max(1e-12));
        }
    }
    Embedding {
        object: "embedding",
        index,
        embedding: match format {
            EncodingFormat::Float => EmbeddingVector::Float(v),
            EncodingFormat::Base64 => EmbeddingVector::Base64(base64_f32(&v)),
        },
    }
}

/// The size of the returned embeddings: the model's, or a Matryoshka size it was trained for.
fn check_dimensions(info: &super::ModelInfo, want: Option<u32>) -> Result<usize, ApiError> {
    let full = info.dimensions;
    let Some(want) = want.map(|w| w as usize) else {
        return Ok(full);
    };
    if want == full || info.matryoshka.as_ref().is_some_and(|d| d.contains(&want)) {
        return Ok(want);
    }
    let message = match &info.matryoshka {
        Some(d) => format!("`dimensions` must be {full} or one of {d:?}, got {want}"),
        None => format!(
            "`dimensions`: this model does not support truncated embeddings; omit it or give {full}, got {want}"
        ),
    };
    Err(ApiError::invalid("dimensions", message))
}

/// Every input as token ids, checked against the model's limits (on the blocking pool: tokenizing
/// 2,048 texts is not for the async workers).
async fn tokenize(st: &Arc<EmbedState>, req: &EmbeddingRequest) -> Result<Vec<Vec<u32>>, ApiError> {
    let items = req.inputs().map_err(|m| ApiError::invalid("input", m))?;
    let owned: Vec<Result<String, Vec<u32>>> = items
        .iter()
        .map(|i| match i {
            Input::Text(t) => Ok(t.to_string()),
            Input::Tokens(ids) => Err(ids.to_vec()),
        })
        .collect();
    let st2 = st.clone();
    tokio::task::spawn_blocking(move || {
        let info = &st2.model;
        owned
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                let ids = match item {
                    Ok(text) => {
                        // Refuse a text that cannot fit before tokenizing it.
                        if info.tokenizer.min_tokens_for(&text) > info.max_input_tokens {
                            return Err(too_long(i, None, info.max_input_tokens));
                        }
                        info.tokenizer
                            .encode(&text, true)
                            .map_err(|e| ApiError::invalid("input", format!("`input` item {i}: {e}")))?
                    }
                    Err(ids) => {
                        if let Some(bad) = ids.iter().find(|&&t| t as usize >= info.vocab_size) {
                            return Err(ApiError::invalid(
                                "input",
                                format!(
                                    "`input` item {i}: token id {bad} is not below the vocabulary size {}",
                                    info.vocab_size
                                ),
                            ));
                        }
                        ids
                    }
                };
                if ids.is_empty() {
                    return Err(ApiError::invalid(
                        "input",
                        format!("`input` item {i} has no tokens"),
                    ));
                }
                if ids.len() > info.max_input_tokens {
                    return Err(too_long(i, Some(ids.len()), info.max_input_tokens));
                }
                Ok(ids)
            })
            .collect()
    })
    .await
    .map_err(|_| ApiError::new(ApiErrorKind::Internal, "tokenizing failed"))?
}

fn too_long(i: usize, got: Option<usize>, max: usize) -> ApiError {
    let got = got.map_or_else(|| "more".to_string(), |n| n.to_string());
    ApiError {
        code: Some("context_length_exceeded".into()),
        ..ApiError::invalid(
            "input",
            format!("`input` item {i} has {got} tokens; this model takes at most {max} per input"),
        )
    }
}

/// Counts an answered request and writes its usage line (never its text).
fn record(st: &EmbedState, tenant: &str, tokens: usize, arrival: Instant, scheduled: Instant) {
    let m = &st.metrics;
    let l = [st.served_name.as_str(), tenant];
    let now = Instant::now();
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    m.requests
        .with_label_values(&[st.served_name.as_str(), tenant, "stop"])
        .inc();
    m.prompt_tokens.with_label_values(&l).inc_by(tokens as u64);
    m.request_latency
        .with_label_values(&l)
        .observe(secs(arrival, now));
    m.queue_time
        .with_label_values(&l)
        .observe(secs(arrival, scheduled));
    let line = serde_json::json!({
        "event": "request_finished",
        "endpoint": "embeddings",
        "model": st.served_name,
        "tenant": tenant,
        "finish_reason": "stop",
        "prompt_tokens": tokens,
        "completion_tokens": 0,
        "queue_seconds": secs(arrival, scheduled),
        "latency_seconds": secs(arrival, now),
    });
    if !crate::logging::stdout_line(&line.to_string()) {
        m.log_write_errors.inc();
    }
}
