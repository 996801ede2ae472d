//! The runtime's Prometheus metrics, with the names fixed by docs/design.md and `model` and `tenant` labels
//! where they apply, plus vLLM's whole metric set as aliases ([`vllm`]) so existing dashboards, KEDA
//! triggers and the Gateway API inference extension work unchanged.
//!
//! Invariants: the gauges describe the engine as of its last step (the step loop sets them, nothing
//! else); `kv_cache_usage_ratio` counts blocks referenced by live requests only (evictable cached blocks
//! do not count); every counter only grows; label values are tenant ids and served names, never keys;
//! a finished request is counted once, here, in ours and vLLM's alike ([`RuntimeMetrics::finished`]).

use modelfleet_api::metric_names as names;
pub mod speculative;
pub mod steps;
pub mod vllm;

use modelfleet_engine::sched::Finished;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::sync::OnceLock;
use std::time::Instant;
use vllm::{CacheConfigInfo, EngineCounters, VllmMetrics};

/// TTFT and whole-request latency buckets: from 10 ms (a warm prefix) to 10 minutes (a long queue).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
];
/// Inter-token latency buckets: 1 ms to 5 s.
pub const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
];

/// Every metric the runtime exports.
pub struct RuntimeMetrics {
    registry: Registry,
    /// `modelfleet_requests_waiting{model}`.
    pub requests_waiting: IntGaugeVec,
    /// `modelfleet_requests_running{model}`.
    pub requests_running: IntGaugeVec,
    /// `modelfleet_kv_cache_usage_ratio{model}`: live-referenced blocks ÷ total.
    pub kv_cache_usage_ratio: GaugeVec,
    /// `modelfleet_kv_cache_cached_blocks{model}`: evictable blocks holding a cached prefix.
    pub kv_cache_cached_blocks: IntGaugeVec,
    /// `modelfleet_prefix_cache_queries_total{model,tenant}` (tokens looked up).
    pub prefix_cache_queries: IntCounterVec,
    /// `modelfleet_prefix_cache_hits_total{model,tenant}` (tokens found).
    pub prefix_cache_hits: IntCounterVec,
    /// `modelfleet_time_to_first_token_seconds{model,tenant}`.
    pub time_to_first_token: HistogramVec,
    /// `modelfleet_inter_token_latency_seconds{model,tenant}`.
    pub inter_token_latency: HistogramVec,
    /// `modelfleet_request_latency_seconds{model,tenant}`.
    pub request_latency: HistogramVec,
    /// `modelfleet_queue_time_seconds{model,tenant}`.
    pub queue_time: HistogramVec,
    /// `modelfleet_prompt_tokens_total{model,tenant}`.
    pub prompt_tokens: IntCounterVec,
    /// `modelfleet_cached_prompt_tokens_total{model,tenant}` (billing: prompt tokens served from cache).
    pub cached_prompt_tokens: IntCounterVec,
    /// `modelfleet_generation_tokens_total{model,tenant}`.
    pub generation_tokens: IntCounterVec,
    /// `modelfleet_requests_total{model,tenant,finish_reason}`.
    pub requests: IntCounterVec,
    /// `modelfleet_requests_rejected_total{model,tenant,reason}`.
    pub requests_rejected: IntCounterVec,
    /// `modelfleet_log_write_errors_total`: usage records lost to a closed or broken stdout.
    pub log_write_errors: prometheus::IntCounter,
    /// vLLM's metrics, registered once the engine is loaded (their buckets follow `max_model_len`).
    vllm: OnceLock<VllmMetrics>,
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn fgauge(name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    GaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        &["model", "tenant"],
    )
    .expect("valid metric")
}

impl Default for RuntimeMetrics {
    fn default() -> Self {
        let mt = &["model", "tenant"];
        let m = RuntimeMetrics {
            registry: Registry::new(),
            requests_waiting: gauge(
                names::REQUESTS_WAITING,
                "Requests waiting to be scheduled",
                &["model"],
            ),
            requests_running: gauge(names::REQUESTS_RUNNING, "Requests being generated", &["model"]),
            kv_cache_usage_ratio: fgauge(
                names::KV_CACHE_USAGE_RATIO,
                "KV blocks referenced by live requests / total blocks (evictable cached blocks excluded)",
                &["model"],
            ),
            kv_cache_cached_blocks: gauge(
                names::KV_CACHE_CACHED_BLOCKS,
                "Evictable KV blocks holding a cached prefix",
                &["model"],
            ),
            prefix_cache_queries: counter(
                names::PREFIX_CACHE_QUERIES,
                "Prompt tokens looked up in the prefix cache",
                mt,
            ),
            prefix_cache_hits: counter(
                names::PREFIX_CACHE_HITS,
                "Prompt tokens found in the prefix cache",
                mt,
            ),
            time_to_first_token: histogram(
                names::TIME_TO_FIRST_TOKEN,
                "Time from arrival to the first generated token",
                LATENCY_BUCKETS,
            ),
            inter_token_latency: histogram(
                names::INTER_TOKEN_LATENCY,
                "Time between consecutive generated tokens",
                ITL_BUCKETS,
            ),
            request_latency: histogram(
                names::REQUEST_LATENCY,
                "Time from arrival to the last token",
                LATENCY_BUCKETS,
            ),
            queue_time: histogram(
                names::QUEUE_TIME,
                "Time spent waiting before the first step",
                LATENCY_BUCKETS,
            ),
            prompt_tokens: counter(names::PROMPT_TOKENS, "Prompt tokens processed", mt),
            cached_prompt_tokens: counter(
                names::CACHED_PROMPT_TOKENS,
                "Prompt tokens served from the prefix cache",
                mt,
            ),
            generation_tokens: counter(names::GENERATION_TOKENS, "Tokens generated", mt),
            requests: counter(
                names::REQUESTS,
                "Finished requests by finish reason",
                &["model", "tenant", "finish_reason"],
            ),
            requests_rejected: counter(
                names::REQUESTS_REJECTED,
                "Requests refused before generation, by reason",
                &["model", "tenant", "reason"],
            ),
            log_write_errors: prometheus::IntCounter::new(
                names::LOG_WRITE_ERRORS,
                "Usage records that could not be written to stdout (closed or broken pipe)",
            )
            .expect("valid metric"),
            vllm: OnceLock::new(),
        };
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(m.requests_waiting.clone()),
            Box::new(m.requests_running.clone()),
            Box::new(m.kv_cache_usage_ratio.clone()),
            Box::new(m.kv_cache_cached_blocks.clone()),
            Box::new(m.prefix_cache_queries.clone()),
            Box::new(m.prefix_cache_hits.clone()),
            Box::new(m.time_to_first_token.clone()),
            Box::new(m.inter_token_latency.clone()),
            Box::new(m.request_latency.clone()),
            Box::new(m.queue_time.clone()),
            Box::new(m.prompt_tokens.clone()),
            Box::new(m.cached_prompt_tokens.clone()),
            Box::new(m.generation_tokens.clone()),
            Box::new(m.requests.clone()),
            Box::new(m.requests_rejected.clone()),
            Box::new(m.log_write_errors.clone()),
        ];
        for c in collectors {
            m.registry.register(c).expect("unique metric names");
        }
        let traces = modelfleet_telemetry::metrics::TraceMetrics::default();
        m.registry
            .register(Box::new(traces))
            .expect("unique metric names");
        m
    }
}

/// The engine's state after a step, as the gauges show it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineGauges {
    /// Requests waiting.
    pub waiting: i64,
    /// Requests running.
    pub running: i64,
    /// Live-referenced KV blocks.
    pub blocks_in_use: u64,
    /// Evictable blocks holding cached prefixes.
    pub blocks_cached: u64,
    /// All KV blocks.
    pub blocks_total: u64,
    /// The engine's cumulative preemption and prefix-cache counters.
    pub counters: EngineCounters,
}

impl From<&modelfleet_engine::sched::Stats> for EngineGauges {
    fn from(s: &modelfleet_engine::sched::Stats) -> Self {
        EngineGauges {
            waiting: s.waiting as i64,
            running: s.running as i64,
            blocks_in_use: s.kv_blocks_in_use as u64,
            blocks_cached: s.kv_blocks_cached as u64,
            blocks_total: s.kv_blocks_total as u64,
            counters: EngineCounters {
                preemptions: s.counters.preemptions,
                prefix_queries: s.counters.prefix_query_tokens,
                prefix_hits: s.counters.prefix_hit_tokens,
            },
        }
    }
}

impl RuntimeMetrics {
    /// Sets the gauges (and their vLLM aliases) for `model` from one step's figures.
    pub fn set_engine(&self, model: &str, g: EngineGauges) {
        let usage = if g.blocks_total == 0 {
            0.0
        } else {
            g.blocks_in_use as f64 / g.blocks_total as f64
        };
        self.requests_waiting.with_label_values(&[model]).set(g.waiting);
        self.requests_running.with_label_values(&[model]).set(g.running);
        self.kv_cache_usage_ratio.with_label_values(&[model]).set(usage);
        self.kv_cache_cached_blocks
            .with_label_values(&[model])
            .set(g.blocks_cached as i64);
        if let Some(v) = self.vllm.get() {
            v.set_engine(g.waiting, g.running, usage, g.counters);
        }
    }

    /// Registers vLLM's metrics for `model` once the engine is loaded (a second call changes nothing).
    pub fn init_vllm(&self, model: &str, max_model_len: usize, cache: &CacheConfigInfo) {
        self.vllm
            .get_or_init(|| VllmMetrics::new(&self.registry, model, max_model_len, cache));
    }

    /// One gap between consecutive tokens of a request, in ours and vLLM's histograms.
    pub fn inter_token(&self, model: &str, tenant: &str, secs: f64) {
        self.inter_token_latency
            .with_label_values(&[model, tenant])
            .observe(secs);
        if let Some(v) = self.vllm.get() {
            v.inter_token(secs);
        }
    }

    /// An accepted request's `n` (choices per prompt) and `max_tokens`, for vLLM's histograms.
    pub fn request_params(&self, n: usize, max_tokens: usize) {
        if let Some(v) = self.vllm.get() {
            v.request_params(n, max_tokens);
        }
    }

    /// Counts a finished request of `tenant` on `model`: tokens, finish reason, latencies — ours and
    /// vLLM's.
    pub fn finished(&self, model: &str, tenant: &str, f: &Finished) {
        let l = [model, tenant];
        let u = f.usage;
        self.requests
            .with_label_values(&[model, tenant, f.reason.as_str()])
            .inc();
        for (counter, n) in [
            (&self.prompt_tokens, u.prompt_tokens),
            (&self.cached_prompt_tokens, u.cached_tokens),
            (&self.prefix_cache_queries, u.prompt_tokens),
            (&self.prefix_cache_hits, u.cached_tokens),
            (&self.generation_tokens, u.completion_tokens),
        ] {
            counter.with_label_values(&l).inc_by(n as u64);
        }
        let t = f.timings;
        let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
        self.request_latency
            .with_label_values(&l)
            .observe(secs(t.arrival, t.finished));
        if let Some(s) = t.first_scheduled {
            self.queue_time.with_label_values(&l).observe(secs(t.arrival, s));
        }
        if let Some(ft) = t.first_token {
            self.time_to_first_token
                .with_label_values(&l)
                .observe(secs(t.arrival, ft));
        }
        if let Some(v) = self.vllm.get() {
            v.finished(f);
        }
    }

    /// The registry every metric is in (other modules register theirs here).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("the text format is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    fn cache() -> CacheConfigInfo {
        CacheConfigInfo {
            block_size: 16,
            num_gpu_blocks: 100,
            cache_dtype: "auto".into(),
            enable_prefix_caching: true,
            kv_cache_memory_bytes: 100 * 8192,
        }
    }

    #[test]
    fn gauges_and_aliases_agree() {
        let m = RuntimeMetrics::default();
        m.init_vllm("tiny", 2048, &cache());
        m.set_engine(
            "tiny",
            EngineGauges {
                waiting: 3,
                running: 5,
                blocks_in_use: 25,
                blocks_cached: 7,
                blocks_total: 100,
                counters: EngineCounters {
                    preemptions: 2,
                    prefix_queries: 64,
                    prefix_hits: 32,
                },
            },
        );
        let text = m.render();
        assert_eq!(
            sample(&text, "modelfleet_requests_waiting{model=\"tiny\"}"),
            Some(3.0)
        );
        assert_eq!(
            sample(
                &text,
                "vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"}"
            ),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, "modelfleet_requests_running{model=\"tiny\"}"),
            Some(5.0)
        );
        assert_eq!(
            sample(
                &text,
                "vllm:num_requests_running{engine=\"0\",model_name=\"tiny\"}"
            ),
            Some(5.0)
        );
        assert_eq!(
            sample(&text, "modelfleet_kv_cache_usage_ratio{model=\"tiny\"}"),
            Some(0.25)
        );
        assert_eq!(
            sample(
                &text,
                "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny\"}"
            ),
            Some(0.25)
        );
        assert_eq!(
            sample(&text, "modelfleet_kv_cache_cached_blocks{model=\"tiny\"}"),
            Some(7.0)
        );
        assert_eq!(
            sample(
                &text,
                "vllm:num_preemptions_total{engine=\"0\",model_name=\"tiny\"}"
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"tiny\"}"
            ),
            Some(32.0)
        );
    }

    #[test]
    fn every_design_metric_is_exported() {
        let m = RuntimeMetrics::default();
        m.init_vllm("tiny", 2048, &cache());
        let l = &["tiny", "team-a"];
        m.set_engine("tiny", EngineGauges::default());
        m.prefix_cache_queries.with_label_values(l).inc_by(32);
        m.prefix_cache_hits.with_label_values(l).inc_by(16);
        m.time_to_first_token.with_label_values(l).observe(0.2);
        m.inter_token_latency.with_label_values(l).observe(0.02);
        m.request_latency.with_label_values(l).observe(1.5);
        m.queue_time.with_label_values(l).observe(0.01);
        m.prompt_tokens.with_label_values(l).inc_by(100);
        m.cached_prompt_tokens.with_label_values(l).inc_by(16);
        m.generation_tokens.with_label_values(l).inc_by(20);
        m.requests.with_label_values(&["tiny", "team-a", "stop"]).inc();
        m.requests_rejected
            .with_label_values(&["tiny", "team-a", "queue_full"])
            .inc();
        let text = m.render();
        for name in [
            "modelfleet_requests_waiting",
            "modelfleet_requests_running",
            "modelfleet_kv_cache_usage_ratio",
            "modelfleet_kv_cache_cached_blocks",
            "modelfleet_prefix_cache_queries_total",
            "modelfleet_prefix_cache_hits_total",
            "modelfleet_time_to_first_token_seconds_bucket",
            "modelfleet_inter_token_latency_seconds_bucket",
            "modelfleet_request_latency_seconds_bucket",
            "modelfleet_queue_time_seconds_bucket",
            "modelfleet_prompt_tokens_total",
            "modelfleet_generation_tokens_total",
            "modelfleet_requests_total",
            "modelfleet_requests_rejected_total",
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
        ] {
            assert!(text.contains(&format!("\n{name}{{")), "{name} missing");
        }
        assert!(text.contains(
            "modelfleet_requests_total{finish_reason=\"stop\",model=\"tiny\",tenant=\"team-a\"} 1"
        ));
        assert!(text.contains("le=\"640\""), "TTFT buckets reach minutes");
    }
}
