//! vLLM's metric set on a running `serve`: every name vLLM documents for its dashboards, KEDA triggers
//! and the Gateway API Inference Extension's endpoint picker is scraped from `/metrics`, with vLLM's
//! type, its `model_name` label, and — for the counters — a series from start-up (at 0 before the first
//! request), then moving with a real request.
//!
//! The list below is written from vLLM's documentation ("Production Metrics", and
//! `vllm/v1/metrics/loggers.py`, which the page is generated from), not from our code, so a misspelt or
//! mistyped alias fails here.

mod common;

/// (name as exposed, type, the `# TYPE` family) — counters carry `_total`, as vLLM's Python client
/// writes them in the text format.
const VLLM: &[(&str, &str)] = &[
    // Scheduler state (KEDA, the endpoint picker's queue and running-requests scorers).
    ("vllm:num_requests_running", "gauge"),
    ("vllm:num_requests_waiting", "gauge"),
    // KV-cache usage 0–1 (the endpoint picker's KV scorer); the earlier name too.
    ("vllm:kv_cache_usage_perc", "gauge"),
    ("vllm:gpu_cache_usage_perc", "gauge"),
    // Counters.
    ("vllm:prefix_cache_queries_total", "counter"),
    ("vllm:prefix_cache_hits_total", "counter"),
    ("vllm:num_preemptions_total", "counter"),
    ("vllm:prompt_tokens_total", "counter"),
    ("vllm:prompt_tokens_cached_total", "counter"),
    ("vllm:generation_tokens_total", "counter"),
    ("vllm:request_success_total", "counter"),
    // Latency histograms, seconds.
    ("vllm:time_to_first_token_seconds", "histogram"),
    ("vllm:inter_token_latency_seconds", "histogram"),
    ("vllm:time_per_output_token_seconds", "histogram"),
    ("vllm:request_time_per_output_token_seconds", "histogram"),
    ("vllm:e2e_request_latency_seconds", "histogram"),
    ("vllm:request_queue_time_seconds", "histogram"),
    ("vllm:request_inference_time_seconds", "histogram"),
    ("vllm:request_prefill_time_seconds", "histogram"),
    ("vllm:request_decode_time_seconds", "histogram"),
    // Length histograms, tokens.
    ("vllm:request_prompt_tokens", "histogram"),
    ("vllm:request_generation_tokens", "histogram"),
    ("vllm:request_max_num_generation_tokens", "histogram"),
    ("vllm:request_params_n", "histogram"),
    ("vllm:request_params_max_tokens", "histogram"),
    // Info gauges: cache config (the endpoint picker's prefix scorer reads block_size and
    // num_gpu_blocks) and LoRA (its LoRA affinity).
    ("vllm:cache_config_info", "gauge"),
    ("vllm:lora_requests_info", "gauge"),
];

fn scrape(s: &common::Server) -> String {
    let (status, body) = common::http(s.admin_port, "GET", "/metrics", &[], "");
    assert_eq!(status, 200, "{body}");
    body
}

/// The samples of `name` (exactly; histograms as their `_count`).
fn samples<'a>(text: &'a str, name: &str, ty: &str) -> Vec<&'a str> {
    let series = if ty == "histogram" {
        format!("{name}_count")
    } else {
        name.to_string()
    };
    text.lines()
        .filter(|l| l.starts_with(&format!("{series}{{")) || l.starts_with(&format!("{series} ")))
        .collect()
}

fn value(line: &str) -> f64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn every_vllm_metric_is_exported_with_its_type_and_labels() {
    let s = common::start(&["--max-model-len", "512"], |_| vec![]);
    let before = scrape(&s);
    for (name, ty) in VLLM {
        assert!(
            before.contains(&format!("# TYPE {name} {ty}\n")),
            "`# TYPE {name} {ty}` missing from /metrics"
        );
        if !matches!(*name, "vllm:lora_requests_info" | "vllm:cache_config_info") {
            let lines = samples(&before, name, ty);
            assert!(!lines.is_empty(), "{name} has no series before the first request");
            assert!(
                lines.iter().all(|l| l.contains("model_name=\"tiny\"")),
                "{name} lacks model_name: {lines:?}"
            );
        }
        if *ty == "counter" {
            assert!(
                samples(&before, name, ty).iter().all(|l| value(l) == 0.0),
                "{name} starts at 0"
            );
        }
    }
    // One of each finish reason vLLM knows, from the start.
    for reason in ["stop", "length", "abort", "error", "repetition"] {
        assert!(
            before.contains(&format!("finished_reason=\"{reason}\"")),
            "request_success has no {reason} series"
        );
    }
    let info = samples(&before, "vllm:cache_config_info", "gauge");
    assert!(
        info.iter()
            .any(|l| l.contains("block_size=\"16\"") && l.contains("num_gpu_blocks=\"") && value(l) == 1.0),
        "{info:?}"
    );

    // One request of 8 tokens moves the counters and histograms.
    let body = r#"{"model":"tiny","prompt":"hello there","max_tokens":8,"temperature":0,"ignore_eos":true}"#;
    let (status, answer) = common::http(s.port, "POST", "/v1/completions", &[], body);
    assert_eq!(status, 200, "{answer}");
    let after = scrape(&s);
    let one = |name: &str, ty: &str| -> f64 { samples(&after, name, ty).iter().map(|l| value(l)).sum() };
    assert_eq!(one("vllm:generation_tokens_total", "counter"), 8.0);
    assert!(one("vllm:prompt_tokens_total", "counter") >= 2.0);
    let length = samples(&after, "vllm:request_success_total", "counter")
        .into_iter()
        .find(|l| l.contains("finished_reason=\"length\""))
        .map(value);
    assert_eq!(length, Some(1.0));
    for name in [
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_params_max_tokens",
        "vllm:request_params_n",
    ] {
        assert_eq!(one(name, "histogram"), 1.0, "{name} observed the request once");
    }
    // Token-count buckets follow max_model_len (1-2-5 up to 512), as vLLM's do.
    let bounds: Vec<&str> = after
        .lines()
        .filter(|l| l.starts_with("vllm:request_prompt_tokens_bucket{"))
        .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        bounds,
        ["1", "2", "5", "10", "20", "50", "100", "200", "500", "+Inf"]
    );
}
