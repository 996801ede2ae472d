//! vLLM's metric set, exported beside ours under vLLM's names, types, units, buckets and labels
//! (`model_name`, `engine="0"`), so vLLM's Grafana dashboard, KEDA triggers written for vLLM and the
//! Gateway API Inference Extension's endpoint picker read a modelfleet runtime unchanged.
//!
//! Sources (checked against vLLM's `vllm/v1/metrics/loggers.py` and "Production Metrics" docs): the
//! scheduler gauges `vllm:num_requests_running|waiting`, `vllm:kv_cache_usage_perc` (0–1); the counters
//! `vllm:prefix_cache_queries|hits` (tokens), `vllm:num_preemptions`, `vllm:prompt_tokens`,
//! `vllm:prompt_tokens_cached`, `vllm:generation_tokens`, `vllm:request_success{finished_reason}` (named
//! here with the `_total` that vLLM's Python client adds in the text format, so the exposition is the
//! same line for line); the histograms of time to first token, inter-token latency, per-request
//! time per output token, end-to-end, queue, inference, prefill and decode time (seconds), of prompt and
//! generation lengths, the largest generation per request and the `n` and `max_tokens` parameters (1-2-5
//! buckets up to `max_model_len`); the earlier names older dashboards and endpoint pickers still read
//! (`vllm:gpu_cache_usage_perc`, `vllm:time_per_output_token_seconds`), fed the same values;
//! `vllm:cache_config_info` (a gauge at 1 whose labels carry `block_size`, `num_gpu_blocks`, …, which
//! the endpoint picker's prefix scorer reads). `vllm:lora_requests_info` lives with the adapters
//! (`crate::adapters::LoraMetrics`).
//!
//! Invariants: every series exists from start-up (counters at 0, one per finish reason; histograms
//! empty), so rate queries and `absent()` alerts work before the first request; engine counters
//! (preemptions, prefix-cache queries and hits) follow the step loop's cumulative counters by delta, so
//! they only grow; our finish reasons map onto vLLM's (`cancelled` and `timeout` are `abort`).

use modelfleet_api::metric_names as names;
use modelfleet_engine::sched::Finished;
use modelfleet_engine::stop::FinishReason;
use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::sync::Mutex;

/// Labels of every per-engine vLLM metric.
pub const LABELS: &[&str] = &["model_name", "engine"];
/// The engine index label value: one engine per runtime process.
pub const ENGINE: &str = "0";
/// vLLM's finish reasons, in its enum's order.
pub const FINISHED_REASONS: &[&str] = &["stop", "length", "abort", "error", "repetition"];

/// vLLM's TTFT buckets (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's inter-token and time-per-output-token buckets (seconds).
const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// vLLM's request-phase latency buckets (seconds).
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];

/// 1, 2, 5, 10, 20, 50, … up to `max` (vLLM's token-count buckets).
pub fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    loop {
        for m in [1, 2, 5] {
            let v = m * scale;
            if v > max {
                return out;
            }
            out.push(v as f64);
        }
        scale = scale.saturating_mul(10);
    }
}

/// The vLLM cache configuration, as `vllm:cache_config_info`'s labels state it.
#[derive(Clone, Debug)]
pub struct CacheConfigInfo {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the pool (vLLM calls them GPU blocks).
    pub num_gpu_blocks: usize,
    /// `--kv-cache-dtype` as given (`auto`, `float32`, `float16`, `q8_0`).
    pub cache_dtype: String,
    /// Prefix caching on.
    pub enable_prefix_caching: bool,
    /// Bytes of KV storage.
    pub kv_cache_memory_bytes: u64,
}

/// The engine's cumulative counters at a scrape (the step loop's `Stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Preemptions.
    pub preemptions: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: u64,
    /// Of those, found.
    pub prefix_hits: u64,
}

/// vLLM's metrics of one runtime.
pub struct VllmMetrics {
    model: String,
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    kv_usage: GaugeVec,
    gpu_cache_usage: GaugeVec,
    prefix_queries: IntCounterVec,
    prefix_hits: IntCounterVec,
    preemptions: IntCounterVec,
    prompt_tokens: IntCounterVec,
    prompt_tokens_cached: IntCounterVec,
    generation_tokens: IntCounterVec,
    request_success: IntCounterVec,
    ttft: HistogramVec,
    itl: HistogramVec,
    time_per_output_token: HistogramVec,
    tpot: HistogramVec,
    e2e: HistogramVec,
    queue: HistogramVec,
    inference: HistogramVec,
    prefill: HistogramVec,
    decode: HistogramVec,
    prompt_len: HistogramVec,
    generation_len: HistogramVec,
    max_generation_len: HistogramVec,
    params_n: HistogramVec,
    params_max_tokens: HistogramVec,
    cache_config: GaugeVec,
    /// The engine counters as last seen, for deltas.
    last: Mutex<EngineCounters>,
}

fn counter(name: &str, help: &str, extra: &[&str]) -> IntCounterVec {
    let labels: Vec<&str> = LABELS.iter().chain(extra).copied().collect();
    IntCounterVec::new(Opts::new(name, help), &labels).expect("valid metric")
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), LABELS).expect("valid metric")
}

impl VllmMetrics {
    /// Registers every vLLM metric in `registry` for `model` (the served name), with token-count buckets
    /// up to `max_model_len`, and sets `vllm:cache_config_info`.
    pub fn new(registry: &Registry, model: &str, max_model_len: usize, cache: &CacheConfigInfo) -> Self {
        let tokens = || buckets_1_2_5(max_model_len.max(1));
        let cache_labels = [
            "block_size",
            "cache_dtype",
            "enable_prefix_caching",
            "num_gpu_blocks",
            "kv_cache_memory_bytes",
            "engine",
        ];
        let m = Self {
            model: model.to_owned(),
            running: IntGaugeVec::new(
                Opts::new(names::VLLM_REQUESTS_RUNNING, "Number of requests in model execution batches."),
                LABELS,
            )
            .expect("valid metric"),
            waiting: IntGaugeVec::new(
                Opts::new(names::VLLM_REQUESTS_WAITING, "Number of requests waiting to be processed."),
                LABELS,
            )
            .expect("valid metric"),
            kv_usage: GaugeVec::new(
                Opts::new(names::VLLM_KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage."),
                LABELS,
            )
            .expect("valid metric"),
            gpu_cache_usage: GaugeVec::new(
                Opts::new(
                    names::VLLM_GPU_CACHE_USAGE,
                    "GPU KV-cache usage. 1 means 100 percent usage (vLLM's earlier name of kv_cache_usage_perc).",
                ),
                LABELS,
            )
            .expect("valid metric"),
            prefix_queries: counter(
                names::VLLM_PREFIX_CACHE_QUERIES,
                "Prefix cache queries, in terms of number of queried tokens.",
                &[],
            ),
            prefix_hits: counter(
                names::VLLM_PREFIX_CACHE_HITS,
                "Prefix cache hits, in terms of number of cached tokens.",
                &[],
            ),
            preemptions: counter(
                names::VLLM_PREEMPTIONS,
                "Cumulative number of preemption from the engine.",
                &[],
            ),
            prompt_tokens: counter(names::VLLM_PROMPT_TOKENS, "Number of prefill tokens processed.", &[]),
            prompt_tokens_cached: counter(
                names::VLLM_PROMPT_TOKENS_CACHED,
                "Number of cached prompt tokens (local + external).",
                &[],
            ),
            generation_tokens: counter(
                names::VLLM_GENERATION_TOKENS,
                "Number of generation tokens processed.",
                &[],
            ),
            request_success: counter(
                names::VLLM_REQUEST_SUCCESS,
                "Count of successfully processed requests.",
                &["finished_reason"],
            ),
            ttft: histogram(
                names::VLLM_TIME_TO_FIRST_TOKEN,
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS.to_vec(),
            ),
            itl: histogram(
                names::VLLM_INTER_TOKEN_LATENCY,
                "Histogram of inter-token latency in seconds.",
                TPOT_BUCKETS.to_vec(),
            ),
            time_per_output_token: histogram(
                names::VLLM_TIME_PER_OUTPUT_TOKEN,
                "Histogram of time per output token in seconds (vLLM's earlier name of inter_token_latency).",
                TPOT_BUCKETS.to_vec(),
            ),
            tpot: histogram(
                names::VLLM_REQUEST_TIME_PER_OUTPUT_TOKEN,
                "Histogram of time_per_output_token_seconds per request.",
                TPOT_BUCKETS.to_vec(),
            ),
            e2e: histogram(
                names::VLLM_E2E_REQUEST_LATENCY,
                "Histogram of e2e request latency in seconds.",
                REQUEST_BUCKETS.to_vec(),
            ),
            queue: histogram(
                names::VLLM_REQUEST_QUEUE_TIME,
                "Histogram of time spent in WAITING phase for request.",
                REQUEST_BUCKETS.to_vec(),
            ),
            inference: histogram(
                names::VLLM_REQUEST_INFERENCE_TIME,
                "Histogram of time spent in RUNNING phase for request.",
                REQUEST_BUCKETS.to_vec(),
            ),
            prefill: histogram(
                names::VLLM_REQUEST_PREFILL_TIME,
                "Histogram of time spent in PREFILL phase for request.",
                REQUEST_BUCKETS.to_vec(),
            ),
            decode: histogram(
                names::VLLM_REQUEST_DECODE_TIME,
                "Histogram of time spent in DECODE phase for request.",
                REQUEST_BUCKETS.to_vec(),
            ),
            prompt_len: histogram(
                names::VLLM_REQUEST_PROMPT_TOKENS,
                "Number of prefill tokens processed.",
                tokens(),
            ),
            generation_len: histogram(
                names::VLLM_REQUEST_GENERATION_TOKENS,
                "Number of generation tokens processed.",
                tokens(),
            ),
            max_generation_len: histogram(
                names::VLLM_REQUEST_MAX_NUM_GENERATION_TOKENS,
                "Histogram of maximum number of requested generation tokens.",
                tokens(),
            ),
            params_n: histogram(
                names::VLLM_REQUEST_PARAMS_N,
                "Histogram of the n request parameter.",
                vec![1.0, 2.0, 5.0, 10.0, 20.0],
            ),
            params_max_tokens: histogram(
                names::VLLM_REQUEST_PARAMS_MAX_TOKENS,
                "Histogram of the max_tokens request parameter.",
                tokens(),
            ),
            cache_config: GaugeVec::new(
                Opts::new(names::VLLM_CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig"),
                &cache_labels,
            )
            .expect("valid metric"),
            last: Mutex::new(EngineCounters::default()),
        };
        let l = [model, ENGINE];
        // Every series from the start: counters at 0, histograms empty.
        for c in m.counters() {
            c.with_label_values(&l);
        }
        for r in FINISHED_REASONS {
            m.request_success.with_label_values(&[model, ENGINE, r]);
        }
        for h in m.histograms() {
            h.with_label_values(&l);
        }
        m.running.with_label_values(&l);
        m.waiting.with_label_values(&l);
        m.kv_usage.with_label_values(&l);
        m.gpu_cache_usage.with_label_values(&l);
        let bool_str = |b: bool| if b { "True" } else { "False" };
        m.cache_config
            .with_label_values(&[
                cache.block_size.to_string().as_str(),
                &cache.cache_dtype,
                bool_str(cache.enable_prefix_caching),
                &cache.num_gpu_blocks.to_string(),
                &cache.kv_cache_memory_bytes.to_string(),
                ENGINE,
            ])
            .set(1.0);
        let mut collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(m.running.clone()),
            Box::new(m.waiting.clone()),
            Box::new(m.kv_usage.clone()),
            Box::new(m.gpu_cache_usage.clone()),
            Box::new(m.request_success.clone()),
            Box::new(m.cache_config.clone()),
        ];
        for c in m.counters() {
            collectors.push(Box::new(c.clone()));
        }
        for h in m.histograms() {
            collectors.push(Box::new(h.clone()));
        }
        for c in collectors {
            registry.register(c).expect("unique metric names");
        }
        m
    }

    /// The counters labelled by model and engine alone.
    fn counters(&self) -> [&IntCounterVec; 6] {
        [
            &self.prefix_queries,
            &self.prefix_hits,
            &self.preemptions,
            &self.prompt_tokens,
            &self.prompt_tokens_cached,
            &self.generation_tokens,
        ]
    }

    fn histograms(&self) -> [&HistogramVec; 14] {
        [
            &self.ttft,
            &self.itl,
            &self.time_per_output_token,
            &self.tpot,
            &self.e2e,
            &self.queue,
            &self.inference,
            &self.prefill,
            &self.decode,
            &self.prompt_len,
            &self.generation_len,
            &self.max_generation_len,
            &self.params_n,
            &self.params_max_tokens,
        ]
    }

    fn labels(&self) -> [&str; 2] {
        [self.model.as_str(), ENGINE]
    }

    /// Sets the scheduler gauges and advances the engine counters to `counters`.
    pub fn set_engine(&self, waiting: i64, running: i64, kv_usage: f64, counters: EngineCounters) {
        let l = self.labels();
        self.waiting.with_label_values(&l).set(waiting);
        self.running.with_label_values(&l).set(running);
        self.kv_usage.with_label_values(&l).set(kv_usage);
        self.gpu_cache_usage.with_label_values(&l).set(kv_usage);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        for (c, new, old) in [
            (&self.preemptions, counters.preemptions, last.preemptions),
            (&self.prefix_queries, counters.prefix_queries, last.prefix_queries),
            (&self.prefix_hits, counters.prefix_hits, last.prefix_hits),
        ] {
            c.with_label_values(&l).inc_by(new.saturating_sub(old));
        }
        *last = EngineCounters {
            preemptions: counters.preemptions.max(last.preemptions),
            prefix_queries: counters.prefix_queries.max(last.prefix_queries),
            prefix_hits: counters.prefix_hits.max(last.prefix_hits),
        };
    }

    /// One gap between consecutive tokens of a request.
    pub fn inter_token(&self, secs: f64) {
        let l = self.labels();
        self.itl.with_label_values(&l).observe(secs);
        self.time_per_output_token.with_label_values(&l).observe(secs);
    }

    /// An accepted request's `n` and `max_tokens`.
    pub fn request_params(&self, n: usize, max_tokens: usize) {
        let l = self.labels();
        self.params_n.with_label_values(&l).observe(n as f64);
        self.params_max_tokens
            .with_label_values(&l)
            .observe(max_tokens as f64);
    }

    /// A finished request: token counters, its finish reason, and its phase durations.
    pub fn finished(&self, f: &Finished) {
        let l = self.labels();
        let u = f.usage;
        self.prompt_tokens
            .with_label_values(&l)
            .inc_by(u.prompt_tokens as u64);
        self.prompt_tokens_cached
            .with_label_values(&l)
            .inc_by(u.cached_tokens as u64);
        self.generation_tokens
            .with_label_values(&l)
            .inc_by(u.completion_tokens as u64);
        self.request_success
            .with_label_values(&[l[0], l[1], finished_reason(f.reason)])
            .inc();
        self.prompt_len
            .with_label_values(&l)
            .observe(u.prompt_tokens as f64);
        self.generation_len
            .with_label_values(&l)
            .observe(u.completion_tokens as f64);
        self.max_generation_len
            .with_label_values(&l)
            .observe(u.completion_tokens as f64);
        let t = f.timings;
        let secs =
            |a: std::time::Instant, b: std::time::Instant| b.saturating_duration_since(a).as_secs_f64();
        self.e2e
            .with_label_values(&l)
            .observe(secs(t.arrival, t.finished));
        if let Some(s) = t.first_scheduled {
            self.queue.with_label_values(&l).observe(secs(t.arrival, s));
            self.inference.with_label_values(&l).observe(secs(s, t.finished));
            if let Some(ft) = t.first_token {
                self.prefill.with_label_values(&l).observe(secs(s, ft));
            }
        }
        if let Some(ft) = t.first_token {
            self.ttft.with_label_values(&l).observe(secs(t.arrival, ft));
            self.decode.with_label_values(&l).observe(secs(ft, t.finished));
            if u.completion_tokens > 1 {
                self.tpot
                    .with_label_values(&l)
                    .observe(secs(ft, t.finished) / (u.completion_tokens - 1) as f64);
            }
        }
    }
}

/// vLLM's name for how a request ended.
pub fn finished_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled | FinishReason::Timeout => "abort",
        FinishReason::Error => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_buckets_follow_vllm() {
        assert_eq!(buckets_1_2_5(100), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(buckets_1_2_5(2048).last(), Some(&2000.0));
        assert_eq!(buckets_1_2_5(0), Vec::<f64>::new());
    }

    #[test]
    fn engine_counters_advance_by_delta_and_never_go_back() {
        let r = Registry::new();
        let cache = CacheConfigInfo {
            block_size: 16,
            num_gpu_blocks: 100,
            cache_dtype: "auto".into(),
            enable_prefix_caching: true,
            kv_cache_memory_bytes: 819200,
        };
        let m = VllmMetrics::new(&r, "tiny", 2048, &cache);
        let c = |p, q, h| EngineCounters {
            preemptions: p,
            prefix_queries: q,
            prefix_hits: h,
        };
        m.set_engine(1, 2, 0.5, c(1, 10, 4));
        m.set_engine(1, 2, 0.5, c(3, 10, 6));
        m.set_engine(1, 2, 0.5, c(2, 9, 6)); // a stale read: nothing moves back
        let get = |c: &IntCounterVec| c.with_label_values(&["tiny", ENGINE]).get();
        assert_eq!(
            (get(&m.preemptions), get(&m.prefix_queries), get(&m.prefix_hits)),
            (3, 10, 6)
        );
        m.set_engine(1, 2, 0.5, c(4, 12, 6));
        assert_eq!(get(&m.preemptions), 4);
        let text = {
            let mut buf = Vec::new();
            prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut buf).unwrap();
            String::from_utf8(buf).unwrap()
        };
        assert!(text.contains(
            "vllm:request_success_total{engine=\"0\",finished_reason=\"repetition\",model_name=\"tiny\"} 0"
        ));
        assert!(text.contains("num_gpu_blocks=\"100\""), "{text}");
    }
}
