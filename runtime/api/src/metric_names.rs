//! Metric names that more than one binary reads or writes: the runtime pod exports them, the gateway
//! and the operator scrape them, the Helm chart's dashboard and the docs query them. One place, so a
//! rename cannot leave a reader behind (`docs/operations.md` lists them with their labels).

/// Requests waiting to be scheduled on a runtime pod (gauge, `model`).
pub const REQUESTS_WAITING: &str = "modelfleet_requests_waiting";
/// Requests being generated on a runtime pod (gauge, `model`).
pub const REQUESTS_RUNNING: &str = "modelfleet_requests_running";
/// KV blocks referenced by live requests ÷ total (gauge 0–1, `model`).
pub const KV_CACHE_USAGE_RATIO: &str = "modelfleet_kv_cache_usage_ratio";
/// Evictable KV blocks holding a cached prefix (gauge, `model`).
pub const KV_CACHE_CACHED_BLOCKS: &str = "modelfleet_kv_cache_cached_blocks";
/// Prompt tokens looked up in the prefix cache (counter, `model`, `tenant`).
pub const PREFIX_CACHE_QUERIES: &str = "modelfleet_prefix_cache_queries_total";
/// Prompt tokens found in the prefix cache (counter, `model`, `tenant`).
pub const PREFIX_CACHE_HITS: &str = "modelfleet_prefix_cache_hits_total";
/// Arrival to first token (histogram, `model`, `tenant`).
pub const TIME_TO_FIRST_TOKEN: &str = "modelfleet_time_to_first_token_seconds";
/// Between consecutive tokens (histogram, `model`, `tenant`).
pub const INTER_TOKEN_LATENCY: &str = "modelfleet_inter_token_latency_seconds";
/// Arrival to last token (histogram, `model`, `tenant`).
pub const REQUEST_LATENCY: &str = "modelfleet_request_latency_seconds";
/// Arrival to first step (histogram, `model`, `tenant`).
pub const QUEUE_TIME: &str = "modelfleet_queue_time_seconds";
/// Prompt tokens processed (counter, `model`, `tenant`).
pub const PROMPT_TOKENS: &str = "modelfleet_prompt_tokens_total";
/// Prompt tokens served from the prefix cache (counter, `model`, `tenant`).
pub const CACHED_PROMPT_TOKENS: &str = "modelfleet_cached_prompt_tokens_total";
/// Tokens generated (counter, `model`, `tenant`).
pub const GENERATION_TOKENS: &str = "modelfleet_generation_tokens_total";
/// Finished requests (counter, `model`, `tenant`, `finish_reason`).
pub const REQUESTS: &str = "modelfleet_requests_total";
/// Requests refused before generation (counter, `model`, `tenant`, `reason`).
pub const REQUESTS_REJECTED: &str = "modelfleet_requests_rejected_total";

/// Log lines (usage records) that could not be written, e.g. to a closed pipe (counter).
pub const LOG_WRITE_ERRORS: &str = "modelfleet_log_write_errors_total";

/// vLLM's name for [`REQUESTS_WAITING`] (labels `model_name`, `engine`). vLLM's whole set follows, as the
/// runtime exports it beside ours (docs/operations.md lists types and labels).
pub const VLLM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
/// vLLM's name for [`REQUESTS_RUNNING`] (labels `model_name`, `engine`).
pub const VLLM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
/// vLLM's name for [`KV_CACHE_USAGE_RATIO`] (labels `model_name`, `engine`).
pub const VLLM_KV_CACHE_USAGE: &str = "vllm:kv_cache_usage_perc";
/// vLLM's earlier name of [`VLLM_KV_CACHE_USAGE`] (gauge 0–1). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_GPU_CACHE_USAGE: &str = "vllm:gpu_cache_usage_perc";
/// Prompt tokens looked up in the prefix cache (counter). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries_total";
/// Prompt tokens found in the prefix cache (counter). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits_total";
/// Preemptions (counter). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_PREEMPTIONS: &str = "vllm:num_preemptions_total";
/// Prompt tokens processed (counter). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_PROMPT_TOKENS: &str = "vllm:prompt_tokens_total";
/// Prompt tokens served from the cache (counter). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_PROMPT_TOKENS_CACHED: &str = "vllm:prompt_tokens_cached_total";
/// Tokens generated (counter). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_GENERATION_TOKENS: &str = "vllm:generation_tokens_total";
/// Finished requests (counter, `finished_reason`). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_SUCCESS: &str = "vllm:request_success_total";
/// Arrival to first token (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_TIME_TO_FIRST_TOKEN: &str = "vllm:time_to_first_token_seconds";
/// Between consecutive tokens (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_INTER_TOKEN_LATENCY: &str = "vllm:inter_token_latency_seconds";
/// vLLM's earlier name of [`VLLM_INTER_TOKEN_LATENCY`] (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_TIME_PER_OUTPUT_TOKEN: &str = "vllm:time_per_output_token_seconds";
/// Per request: decode time ÷ (generated − 1) (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_TIME_PER_OUTPUT_TOKEN: &str = "vllm:request_time_per_output_token_seconds";
/// Arrival to last token (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_E2E_REQUEST_LATENCY: &str = "vllm:e2e_request_latency_seconds";
/// Time waiting (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_QUEUE_TIME: &str = "vllm:request_queue_time_seconds";
/// Time running (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_INFERENCE_TIME: &str = "vllm:request_inference_time_seconds";
/// Time in prefill (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_PREFILL_TIME: &str = "vllm:request_prefill_time_seconds";
/// Time in decode (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_DECODE_TIME: &str = "vllm:request_decode_time_seconds";
/// Prompt length per request (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_PROMPT_TOKENS: &str = "vllm:request_prompt_tokens";
/// Generated length per request (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_GENERATION_TOKENS: &str = "vllm:request_generation_tokens";
/// Largest generation per request (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_MAX_NUM_GENERATION_TOKENS: &str = "vllm:request_max_num_generation_tokens";
/// The `n` parameter (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_PARAMS_N: &str = "vllm:request_params_n";
/// The `max_tokens` parameter (histogram). vLLM's name, labels `model_name`, `engine`.
pub const VLLM_REQUEST_PARAMS_MAX_TOKENS: &str = "vllm:request_params_max_tokens";
/// The KV cache's configuration in labels (gauge at 1; labels `block_size`, `cache_dtype`, `enable_prefix_caching`, `num_gpu_blocks`, `kv_cache_memory_bytes`, `engine`).
pub const VLLM_CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
/// Adapters loaded and in use in labels (gauge at the last change's time; labels `max_lora`, `running_lora_adapters`, `waiting_lora_adapters`: the inference extension's LoRA-affinity input).
pub const VLLM_LORA_REQUESTS_INFO: &str = "vllm:lora_requests_info";

/// Speculative decoding: verification runs with at least one drafted token (counter, `model`).
pub const SPEC_DECODE_DRAFTS: &str = "modelfleet_spec_decode_drafts_total";
/// Speculative decoding: drafted tokens verified (counter, `model`).
pub const SPEC_DECODE_DRAFT_TOKENS: &str = "modelfleet_spec_decode_draft_tokens_total";
/// Speculative decoding: drafted tokens accepted (counter, `model`).
pub const SPEC_DECODE_ACCEPTED_TOKENS: &str = "modelfleet_spec_decode_accepted_tokens_total";
/// Speculative decoding: drafted tokens accepted by position in their run, 0 = first (counter, `model`,
/// `position`).
pub const SPEC_DECODE_ACCEPTED_PER_POSITION: &str =
    "modelfleet_spec_decode_accepted_tokens_per_position_total";
/// Draft tokens on offer before the step-cost gate (label `model`; ours, no vLLM twin).
pub const SPEC_DECODE_PROPOSED_TOKENS: &str = "modelfleet_spec_decode_proposed_tokens_total";
/// Draft tokens the step-cost gate kept of those on offer (label `model`; ours, no vLLM twin).
pub const SPEC_DECODE_KEPT_TOKENS: &str = "modelfleet_spec_decode_gate_kept_tokens_total";
/// vLLM's name for [`SPEC_DECODE_DRAFTS`] (labels `model_name`, `engine`).
pub const VLLM_SPEC_DECODE_DRAFTS: &str = "vllm:spec_decode_num_drafts_total";
/// vLLM's name for [`SPEC_DECODE_DRAFT_TOKENS`] (labels `model_name`, `engine`).
pub const VLLM_SPEC_DECODE_DRAFT_TOKENS: &str = "vllm:spec_decode_num_draft_tokens_total";
/// vLLM's name for [`SPEC_DECODE_ACCEPTED_TOKENS`] (labels `model_name`, `engine`).
pub const VLLM_SPEC_DECODE_ACCEPTED_TOKENS: &str = "vllm:spec_decode_num_accepted_tokens_total";
/// vLLM's name for [`SPEC_DECODE_ACCEPTED_PER_POSITION`] (labels `model_name`, `engine`, `position`).
pub const VLLM_SPEC_DECODE_ACCEPTED_PER_POSITION: &str = "vllm:spec_decode_num_accepted_tokens_per_pos_total";

/// Gateway: requests answered (counter, `namespace`, `model_deployment`, `tenant`, `outcome`).
pub const GATEWAY_REQUESTS: &str = "modelfleet_gateway_requests_total";
/// Gateway: routing decisions (counter, `model_deployment`, `decision` = affinity | overflow | only).
pub const GATEWAY_ROUTE: &str = "modelfleet_gateway_route_total";
/// Gateway: requests sent again to another pod before their first byte (counter, `model_deployment`).
pub const GATEWAY_RETRIES: &str = "modelfleet_gateway_retries_total";
/// Gateway: connections to a pod that broke after the request was sent and before its answer was
/// complete (counter, `model_deployment`, `verdict` = pod_alive | pod_gone).
pub const GATEWAY_UPSTREAM_RESETS: &str = "modelfleet_gateway_upstream_resets_total";
/// Gateway: requests held while a deployment has no Ready pod (gauge, `namespace`,
/// `model_deployment`); the operator scales from zero on it.
pub const GATEWAY_PENDING_REQUESTS: &str = "modelfleet_gateway_pending_requests";
/// Gateway: requests a deployment's `spec.fallback` moved, or would have moved (counter, `namespace`,
/// `model_deployment` = where the request was sent, `target`, `reason` = no_ready_replica | saturated,
/// `result` = moved | no_deployment | other_tenant | limited). A move counts as demand for
/// `model_deployment`: the operator scales it from zero on its growth as on answered requests.
pub const GATEWAY_FALLBACKS: &str = "modelfleet_gateway_fallbacks_total";
/// Gateway: time from sending upstream to the first byte back (histogram, `model_deployment`).
pub const GATEWAY_UPSTREAM_TTFT: &str = "modelfleet_gateway_upstream_ttft_seconds";
/// Gateway: requests in flight per pod (gauge, `pod`).
pub const GATEWAY_INFLIGHT: &str = "modelfleet_gateway_inflight";
/// Gateway: requests refused by a tenant limit (counter, `namespace`, `model_deployment`, `tenant`,
/// `reason` = concurrency | requests | tokens | daily_budget | monthly_budget | store_unavailable).
pub const GATEWAY_LIMITED: &str = "modelfleet_gateway_limited_total";
/// Gateway: tokens served as the runtime reports them (counter, `namespace`, `model_deployment`,
/// `tenant`, `model`, `kind` = prompt | cached | completion).
pub const GATEWAY_TOKENS: &str = "modelfleet_gateway_tokens_total";
/// Gateway: what tenants were charged, priced from `spec.cost` (counter, `namespace`,
/// `model_deployment`, `tenant`, `model`, `currency`).
pub const GATEWAY_COST: &str = "modelfleet_gateway_cost_total";
/// Gateway: calls to the limits store that failed or timed out (counter, `operation`).
pub const GATEWAY_LIMITS_STORE_ERRORS: &str = "modelfleet_gateway_limits_store_errors_total";
/// Gateway: requests a revision answered, as the canary analysis judges them (counter, `namespace`,
/// `model_deployment`, `revision`, `outcome` = ok | error, `mirrored` = true | false). `error`: a 5xx
/// answer, or a connection or stream that broke (or went silent) before the answer was complete.
pub const GATEWAY_REVISION_REQUESTS: &str = "modelfleet_gateway_revision_requests_total";
/// Gateway: time from sending a request to a pod of a revision to its first body byte, real and
/// mirrored requests alike (histogram, `namespace`, `model_deployment`, `revision`).
pub const GATEWAY_REVISION_TTFT: &str = "modelfleet_gateway_revision_ttft_seconds";
/// Gateway: time between consecutive SSE `data:` events of a revision's streamed answers (histogram,
/// `namespace`, `model_deployment`, `revision`).
pub const GATEWAY_REVISION_ITL: &str = "modelfleet_gateway_revision_itl_seconds";
/// Gateway: pods chosen by revision during a rollout (counter, `namespace`, `model_deployment`,
/// `revision`, `reason` = weight | fallback).
pub const GATEWAY_REVISION_ROUTE: &str = "modelfleet_gateway_revision_route_total";
/// Gateway: mirrored copies not sent (counter, `namespace`, `model_deployment`, `reason` = full |
/// no_pod).
pub const GATEWAY_MIRROR_DROPPED: &str = "modelfleet_gateway_mirror_dropped_total";
