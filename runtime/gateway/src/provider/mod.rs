//! External OpenAI-compatible providers as fallback targets (`spec.fallback.targets[].provider`): a
//! request the fleet cannot start moves there as the caller's request with the provider's model name
//! and the provider's key — never the caller's, which is not sent — and the provider's prices. The
//! answer goes to the client as the provider gave it (`x-modelfleet-served-by: provider:<name>`); its
//! token usage, read from the answer (`usage`, and in a stream the usage chunk the gateway asks for
//! with `stream_options.include_usage`, see [`usage`]), settles the request's lease: usage records and
//! spend name `provider:<name>` as the deployment.
//!
//! Invariants: the caller's headers (its key above all) never reach the provider — only the body,
//! `Content-Type`, `Accept` and the provider's own key; the provider's key is never logged; a provider
//! is the end of the line — what it answers, error or not, goes to the client (a connection it never
//! took becomes a 502 naming it); its `timeoutSeconds` bounds the wait for the first byte and every
//! gap after; a JSON answer is read whole, bounded by [`MAX_JSON_ANSWER`].

pub mod usage;

use crate::fleet::DeploymentId;
use crate::limits::{Lease, Prices};
use crate::proxy::{Job, fail};
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use modelfleet_api::error::{ApiError, ApiErrorKind};
use modelfleet_api::limits::USAGE_HEADER;
use modelfleet_api::limits::parse_micros;
use modelfleet_crds::ProviderTarget;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tracing::Instrument;

/// The largest JSON answer read from a provider.
pub const MAX_JSON_ANSWER: usize = 16 << 20;

/// A provider as the gateway calls it.
#[derive(Debug, PartialEq, Eq)]
pub struct Provider {
    /// Its name (`provider:<name>` in records, metrics and `x-modelfleet-served-by`).
    pub name: String,
    /// Its base URL, without a trailing `/`.
    pub base_url: String,
    /// The model to ask for.
    pub model: String,
    /// Its API key (`None`: none configured), or why it cannot be read (the target is passed over).
    pub key: Result<Option<Arc<str>>, String>,
    /// For the first byte and between bytes.
    pub timeout: Duration,
    /// Its prices, in the deployment's currency.
    pub prices: Prices,
}

impl Provider {
    /// From the spec; `key` as read from its Secret; `currency` the deployment's.
    pub fn new(spec: &ProviderTarget, key: Result<Option<Arc<str>>, String>, currency: &str) -> Provider {
        let p = |v: &Option<String>| v.as_deref().and_then(parse_micros);
        let input = p(&spec.input_per_million_tokens).unwrap_or(0);
        Provider {
            name: spec.name.clone(),
            base_url: spec.base_url.trim_end_matches('/').to_string(),
            model: spec.model.clone(),
            key,
            timeout: Duration::from_secs(spec.timeout_seconds.clamp(1, 600) as u64),
            prices: Prices {
                input,
                cached_input: p(&spec.cached_input_per_million_tokens).unwrap_or(input),
                output: p(&spec.output_per_million_tokens).unwrap_or(0),
                currency: currency.to_string(),
            },
        }
    }

    /// The name records and `x-modelfleet-served-by` give it.
    pub fn label(&self) -> String {
        format!("provider:{}", self.name)
    }

    /// Where `path` (`/v1/chat/completions`) goes.
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path.strip_prefix("/v1").unwrap_or(path))
    }
}

/// The client for providers: the environment's proxy settings apply (egress usually goes through
/// one), HTTP/2 where the provider offers it.
fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("modelfleet-gateway/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("an HTTP client")
    })
}

/// `body` for the provider: its model, and in a stream the usage chunk asked for; with whether the
/// caller asked for that chunk itself. `None` if the body is not a JSON object (it was at the edge).
pub fn body_for(body: &[u8], model: &str) -> Option<(Bytes, bool)> {
    let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    v.insert("model".into(), model.into());
    let mut asked = false;
    if v.get("stream").and_then(|s| s.as_bool()) == Some(true) {
        let options = v.entry("stream_options").or_insert_with(|| serde_json::json!({}));
        if !options.is_object() {
            *options = serde_json::json!({});
        }
        asked = options.get("include_usage").and_then(|u| u.as_bool()) == Some(true);
        options["include_usage"] = true.into();
    }
    Some((Bytes::from(serde_json::to_vec(&v).ok()?), asked))
}

/// Sends `job` (already priced and leased for the provider) to `provider` and answers with what it
/// gives.
pub async fn forward(job: Job, provider: Arc<Provider>, origin: &DeploymentId) -> Response {
    let span = tracing::info_span!(
        "provider",
        "modelfleet.provider" = provider.name.as_str(),
        "http.response.status_code" = tracing::field::Empty,
    );
    let label = provider.label();
    let mut resp = send(job, provider, origin).instrument(span).await;
    if let Ok(v) = HeaderValue::from_str(&label) {
        resp.headers_mut().insert(crate::fallback::SERVED_BY_HEADER, v);
    }
    resp
}

async fn send(mut job: Job, provider: Arc<Provider>, origin: &DeploymentId) -> Response {
    job.record.pod = String::new();
    let Some((body, asked)) = body_for(&job.body, &provider.model) else {
        return fail(
            &mut job.record,
            unreachable(&provider, "the request body is not a JSON object"),
        );
    };
    let stream = job.routed.stream;
    let mut request = client()
        .post(provider.url(&job.path))
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            header::ACCEPT,
            if stream {
                "text/event-stream"
            } else {
                "application/json"
            },
        )
        .body(body);
    if let Ok(Some(key)) = &provider.key {
        request = request.bearer_auth(key);
    }
    let by = tokio::time::Instant::now() + provider.timeout;
    let resp = match tokio::time::timeout_at(by.min(job.deadline), request.send()).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::warn!(provider = %provider.name, model_deployment = %origin, error = %crate::proxy::error_chain(&e), "provider not reached");
            return fail(
                &mut job.record,
                unreachable(&provider, &crate::proxy::error_chain(&e)),
            );
        }
        Err(_) => return fail(&mut job.record, late(&provider)),
    };
    let status = resp.status();
    tracing::Span::current().record("http.response.status_code", status.as_u16());
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if sse && status.is_success() {
        return streamed(job, provider, resp, asked);
    }
    buffered(job, &provider, resp).await
}

/// A JSON answer (or an error): read whole, its usage reported to the lease, passed on.
async fn buffered(mut job: Job, provider: &Provider, mut resp: reqwest::Response) -> Response {
    let status = resp.status();
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let mut body = Vec::new();
    loop {
        let next = tokio::time::timeout(provider.timeout, resp.chunk()).await;
        match next {
            Ok(Ok(Some(c))) if body.len() + c.len() <= MAX_JSON_ANSWER => body.extend_from_slice(&c),
            Ok(Ok(Some(_))) => {
                return fail(&mut job.record, unreachable(provider, "its answer is too large"));
            }
            Ok(Ok(None)) => break,
            Ok(Err(e)) => {
                let why = format!("its answer broke off: {}", crate::proxy::error_chain(&e));
                return fail(&mut job.record, unreachable(provider, &why));
            }
            Err(_) => return fail(&mut job.record, late(provider)),
        }
    }
    if status.is_success() {
        let mut h = axum::http::HeaderMap::new();
        if let Some(v) = usage::of_json(&body).and_then(|r| HeaderValue::from_str(&r).ok()) {
            h.insert(USAGE_HEADER, v);
        }
        job.lease.serving(&h);
    }
    job.record.finish(status.as_str());
    let mut out =
        Response::builder().status(StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY));
    if let Some(ct) = content_type {
        out = out.header(header::CONTENT_TYPE, ct);
    }
    // The lease settles when the answer is built: the tokens are known.
    drop(job.lease);
    out.body(Body::from(body))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

/// What a stream carries along while it passes.
struct Passing {
    resp: reqwest::Response,
    rewrite: usage::StreamUsage,
    lease: Lease,
    record: crate::record::Record,
    timeout: Duration,
    name: String,
    done: bool,
}

/// A stream: passed on as it comes, the usage chunk rewritten for the meter (see [`usage`]).
fn streamed(mut job: Job, provider: Arc<Provider>, resp: reqwest::Response, asked: bool) -> Response {
    job.lease.serving(&axum::http::HeaderMap::new());
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::OK);
    let state = Passing {
        resp,
        rewrite: usage::StreamUsage::new(asked),
        lease: job.lease,
        record: job.record,
        timeout: provider.timeout,
        name: provider.name.clone(),
        done: false,
    };
    let body = futures::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let out = match tokio::time::timeout(s.timeout, s.resp.chunk()).await {
            Ok(Ok(Some(c))) => s.rewrite.feed(&c),
            Ok(Ok(None)) => {
                s.done = true;
                s.record.finish("ok");
                s.rewrite.finish()
            }
            Ok(Err(e)) => {
                s.done = true;
                s.record.finish("upstream_failed");
                let why = format!("provider {} broke off: {}", s.name, crate::proxy::error_chain(&e));
                stream_error(&why)
            }
            Err(_) => {
                s.done = true;
                s.record.finish("timeout");
                stream_error(&format!("provider {} went silent", s.name))
            }
        };
        s.lease.streamed(&out);
        Some((Ok::<_, std::io::Error>(Bytes::from(out)), s))
    });
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

fn stream_error(why: &str) -> Vec<u8> {
    let e = ApiError {
        code: Some("upstream_failed".into()),
        ..ApiError::new(ApiErrorKind::BadGateway, why.to_string())
    };
    format!("data: {}\n\ndata: [DONE]\n\n", e.body()).into_bytes()
}

fn unreachable(p: &Provider, why: &str) -> ApiError {
    ApiError {
        code: Some("upstream_unreachable".into()),
        ..ApiError::new(
            ApiErrorKind::BadGateway,
            format!("the fallback provider `{}` could not answer: {why}", p.name),
        )
    }
}

fn late(p: &Provider) -> ApiError {
    ApiError::new(
        ApiErrorKind::Timeout,
        format!(
            "the fallback provider `{}` did not answer within its timeout ({} s)",
            p.name,
            p.timeout.as_secs()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_asks_for_the_providers_model_and_the_usage_chunk() {
        let (b, asked) = body_for(br#"{"model":"big","stream":true,"max_tokens":3}"#, "gpt-x").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            (
                v["model"].as_str(),
                v["stream_options"]["include_usage"].as_bool()
            ),
            (Some("gpt-x"), Some(true))
        );
        assert!(!asked);
        let (_, asked) = body_for(
            br#"{"model":"big","stream":true,"stream_options":{"include_usage":true}}"#,
            "m",
        )
        .unwrap();
        assert!(asked);
        let (b, _) = body_for(br#"{"model":"big"}"#, "m").unwrap();
        assert_eq!(&b[..], br#"{"model":"m"}"#);
    }

    #[test]
    fn paths_follow_the_base_url() {
        let spec: ProviderTarget = serde_json::from_value(serde_json::json!({
            "name": "p", "baseUrl": "https://api.example.com/v1/", "model": "m",
            "inputPerMillionTokens": "0.15", "outputPerMillionTokens": "0.6"}))
        .unwrap();
        let p = Provider::new(&spec, Ok(None), "USD");
        assert_eq!(
            p.url("/v1/chat/completions"),
            "https://api.example.com/v1/chat/completions"
        );
        assert_eq!(
            (p.prices.input, p.prices.cached_input, p.prices.output),
            (150_000, 150_000, 600_000)
        );
        assert_eq!(p.timeout, Duration::from_secs(60));
        assert_eq!(p.label(), "provider:p");
    }
}
