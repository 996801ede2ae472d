//! `modelfleet-api`: what the runtime server (`modelfleet-runtime serve`) and the fleet gateway
//! (`modelfleet-gateway`) share, so both speak one API with one set of errors.
//!
//! - [`adapters`]: the adapter list the operator writes and the runtime reads (one type for both).
//! - [`wire`]: OpenAI request bodies, parsed strictly (unknown and unsupported fields refused by name).
//! - [`structured`]: structured output (`response_format`, vLLM's `structured_outputs`/`guided_*`) and
//!   tools (`tools`, `tool_choice`), checked for shape and size; one constraint per request.
//! - [`embeddings`]: `POST /v1/embeddings`' request and response (float or base64).
//! - [`response`]: the response bodies (also the OpenAPI schemas).
//! - [`deadline`]: the first-token deadline's header and error code (gateway → pod → gateway).
//! - [`error`]: the one mapping from failures to OpenAI's error shape and HTTP status codes (with the
//!   `axum` feature, `IntoResponse` for it).
//! - [`tenants`]: the tenants file (API keys → tenants and quotas), parsed and checked in constant time.
//! - [`metric_names`]: metric names the runtime exports and the gateway and operator read.
//! - [`exposition`]: reading a Prometheus `/metrics` page (the gateway reads pods' load with it).
//! - [`version`]: what `--version` prints (the release version and the git revision).
//! - `limits`: a tenant's fleet-wide request, token and spend limits, as the tenants file declares them.
//! - `listener` (with the `axum` feature): a bounded HTTP/1.1 listener — connection cap, header read
//!   deadline and size cap, graceful stop.
//!
//! Invariants: no engine, no HTTP server state; nothing here logs or echoes an API key.

pub mod adapters;
pub mod deadline;
pub mod embeddings;
pub mod error;
pub mod exposition;
pub mod limits;
#[cfg(feature = "axum")]
pub mod listener;
pub mod metric_names;
pub mod response;
pub mod structured;
pub mod tenants;
pub mod version;
pub mod wire;
