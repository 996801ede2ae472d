//! The API router and its small handlers: `/v1/models`, `/health`, `/ready`, `/tokenize`,
//! `/detokenize`, `/openapi.json`, and `/metrics` (which the admin listener serves); the generation endpoints live in [`super::openai`].

use super::state::AppState;
use super::{body, openai, prompt, trace};
use crate::api::error::{ApiError, ApiErrorKind};
use crate::api::response::{DetokenizeResponse, ModelCard, ModelList, TokenizeResponse};
use crate::api::wire::ChatMessage as WireMessage;
use crate::api::wire::Prompt;
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::from_fn;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The API router.
pub fn router(st: Arc<AppState>, max_body_bytes: usize) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(openai::chat).layer(from_fn(trace::traced)),
        )
        .route(
            "/v1/completions",
            post(openai::completions).layer(from_fn(trace::traced)),
        )
        .route("/v1/embeddings", post(embeddings_on_a_generation_model))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(st)
}

/// A generation model has no embeddings endpoint: a 400 naming the model's task (after the key check,
/// so it tells nobody unauthenticated what is served).
async fn embeddings_on_a_generation_model(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = st.authenticate(&headers) {
        return e.into_response();
    }
    ApiError::invalid(
        "model",
        format!(
            "`{}` is a generation model: it answers /v1/chat/completions and /v1/completions, not /v1/embeddings",
            st.served_name
        ),
    )
    .into_response()
}

async fn not_found() -> Response {
    ApiError::new(ApiErrorKind::NotFound, "no such endpoint").into_response()
}

/// Liveness: the process and its engine live. A failed engine is 503 here (the process exits moments
/// later anyway; a kubelet probing in between must not count it alive).
pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    match st.engine.failure() {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
        None => "ok".into_response(),
    }
}

async fn ready(State(st): State<Arc<AppState>>) -> Response {
    if let Some(why) = st.engine.failure() {
        return (StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    }
    if st.draining.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    if !st.adapters_ready.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "loading start-up adapters").into_response();
    }
    "ready".into_response()
}

/// `GET /metrics` (served on the admin port: tenant ids and adapter names are not for tenants).
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    st.refresh_gauges();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        st.metrics.render(),
    )
        .into_response()
}

async fn openapi(State(st): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::openapi::document_for(&st.served_name, &st.limits).to_string(),
    )
        .into_response()
}

async fn models(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let tenant = match st.authenticate(&headers) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let card = |id: String, parent: Option<String>| ModelCard {
        id,
        object: "model",
        created: st.created,
        owned_by: "modelfleet",
        parent,
        max_model_len: st.engine.max_model_len(),
    };
    // The base, then the adapters this tenant may use (never the others).
    let mut data = vec![card(st.served_name.clone(), None)];
    data.extend(
        st.adapters
            .visible(&tenant.id)
            .into_iter()
            .map(|a| card(a, Some(st.served_name.clone()))),
    );
    axum::Json(ModelList { object: "list", data }).into_response()
}

/// `POST /tokenize`: a prompt, or chat messages rendered with the template.
#[derive(Deserialize, Debug, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// The served model name (optional).
    #[serde(default)]
    pub model: Option<String>,
    /// Text to tokenize.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Chat messages to render and tokenize instead.
    #[serde(default)]
    pub messages: Option<Vec<WireMessage>>,
    /// Add BOS etc. to a prompt (default true).
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// End the rendered chat with the assistant's header (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Extra variables for the chat template, as in a chat request.
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `POST /detokenize`.
#[derive(Deserialize, Debug, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// The served model name (optional).
    #[serde(default)]
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<u32>,
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid("body", format!("the body is not valid JSON: {e}")))?;
    crate::api::wire::normalize_integers(&mut value);
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = if path == "." { "body".to_string() } else { path };
        ApiError::invalid(param.clone(), format!("`{param}`: {}", e.inner()))
    })
}

async fn tokenize(State(st): State<Arc<AppState>>, headers: HeaderMap, raw: Body) -> Response {
    let run = async {
        let tenant = st.authenticate(&headers)?;
        let req: TokenizeRequest = parse(&body::read(raw, st.body).await?)?;
        if let Some(m) = &req.model {
            st.check_model(m, &tenant)?;
        }
        let tokens = match (req.prompt, req.messages) {
            (Some(p), None) => {
                let add = req.add_special_tokens.unwrap_or(true);
                prompt::completion(&st, Prompt::Text(p), add)
                    .await?
                    .pop()
                    .unwrap_or_default()
            }
            (None, Some(msgs)) => {
                let md = st.model().clone();
                let template = md
                    .chat_template
                    .as_ref()
                    .ok_or_else(|| ApiError::invalid("messages", "this model has no chat template"))?;
                // The history renders as in a chat request without tools (calls and results included).
                let no_tools = crate::api::structured::tool_plan(None, None, None)?;
                let (msgs, _) = super::tools::messages(&no_tools, &msgs, template.renders_tools());
                prompt::check_template_kwargs(req.chat_template_kwargs.as_ref())?;
                let input = prompt::ChatInput {
                    messages: msgs,
                    tools: None,
                    add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
                    kwargs: req.chat_template_kwargs,
                };
                prompt::chat(&st, input).await?.ids
            }
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "give exactly one of `prompt` and `messages`",
                ));
            }
        };
        Ok::<_, ApiError>(TokenizeResponse {
            count: tokens.len(),
            tokens,
            max_model_len: st.engine.max_model_len(),
        })
    };
    match run.await {
        Ok(r) => axum::Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn detokenize(State(st): State<Arc<AppState>>, headers: HeaderMap, raw: Body) -> Response {
    let run = async {
        let tenant = st.authenticate(&headers)?;
        let req: DetokenizeRequest = parse(&body::read(raw, st.body).await?)?;
        if let Some(m) = &req.model {
            st.check_model(m, &tenant)?;
        }
        let vocab = st.model().config.vocab_size;
        if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid(
                "tokens",
                format!("`tokens` ids must be < {vocab} (the vocabulary size), got {bad}"),
            ));
        }
        let prompt = st
            .model()
            .tokenizer
            .decode(&req.tokens, false)
            .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
        Ok::<_, ApiError>(DetokenizeResponse { prompt })
    };
    match run.await {
        Ok(r) => axum::Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}
