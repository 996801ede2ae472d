//! Span and attribute names the binaries share.
//!
//! The `gen_ai.*` names follow the OpenTelemetry GenAI semantic conventions
//! (<https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/>); they are our own constants
//! because the semantic-conventions crate keeps them behind an experimental feature, deprecated. The
//! latency names are vLLM's request-level ones (`gen_ai.latency.*`), so a trace from our pods reads
//! like one from vLLM's.

pub const OPERATION_NAME: &str = "gen_ai.operation.name";
pub const SYSTEM: &str = "gen_ai.system";
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
pub const REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
pub const REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
pub const REQUEST_TOP_P: &str = "gen_ai.request.top_p";
pub const REQUEST_ID: &str = "gen_ai.request.id";
pub const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
/// vLLM's request-level latencies, in seconds.
pub const LATENCY_TIME_IN_QUEUE: &str = "gen_ai.latency.time_in_queue";
pub const LATENCY_TIME_TO_FIRST_TOKEN: &str = "gen_ai.latency.time_to_first_token";
pub const LATENCY_E2E: &str = "gen_ai.latency.e2e";
pub const LATENCY_TIME_IN_MODEL_PREFILL: &str = "gen_ai.latency.time_in_model_prefill";
pub const LATENCY_TIME_IN_MODEL_DECODE: &str = "gen_ai.latency.time_in_model_decode";

/// Our own attributes (no convention names them).
pub const TENANT: &str = "modelfleet.tenant";
pub const REVISION: &str = "modelfleet.revision";
pub const POD: &str = "modelfleet.pod";
pub const ROUTE_REASON: &str = "modelfleet.route.reason";
pub const RETRY_REASON: &str = "modelfleet.retry.reason";
pub const ATTEMPT: &str = "modelfleet.attempt";
