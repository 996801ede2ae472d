//! Per-adapter metrics: requests running and waiting (from the step loop's last step), loads,
//! evictions and load latency — plus vLLM's `vllm:lora_requests_info`, whose labels list the adapters
//! running and waiting (comma-separated) and `max_lora`, its value the time it was set.
//!
//! Invariants: gauges are reset before each refresh, so an adapter with no requests left disappears
//! instead of reporting stale counts; label values are served names, never URIs or tokens.

use modelfleet_api::metric_names as names;
use modelfleet_engine::sched::AdapterCount;
use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::time::Duration;

/// Adapter load buckets: 10 ms (from memory) to 10 minutes (a large download).
const LOAD_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
];

/// The LoRA metrics of one server.
pub struct LoraMetrics {
    model: String,
    max_loras: usize,
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    loads: IntCounterVec,
    evictions: IntCounterVec,
    load_seconds: HistogramVec,
    vllm_info: GaugeVec,
}

impl LoraMetrics {
    /// Registers the metrics in `registry`, labelled with the base model's served name.
    pub fn new(registry: &Registry, model: &str, max_loras: usize) -> Self {
        let ma = &["model", "adapter"];
        let m = Self {
            model: model.to_owned(),
            max_loras,
            running: IntGaugeVec::new(
                Opts::new(
                    "modelfleet_lora_requests_running",
                    "Requests being generated, per adapter",
                ),
                ma,
            )
            .expect("valid metric"),
            waiting: IntGaugeVec::new(
                Opts::new(
                    "modelfleet_lora_requests_waiting",
                    "Requests waiting, per adapter",
                ),
                ma,
            )
            .expect("valid metric"),
            loads: IntCounterVec::new(
                Opts::new(
                    "modelfleet_lora_loads_total",
                    "Adapter loads (first loads, new generations and reloads after eviction)",
                ),
                ma,
            )
            .expect("valid metric"),
            evictions: IntCounterVec::new(
                Opts::new("modelfleet_lora_evictions_total", "Adapters evicted from memory"),
                ma,
            )
            .expect("valid metric"),
            load_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "modelfleet_lora_load_seconds",
                    "Adapter load latency: fetch, verification and reading, to servable",
                )
                .buckets(LOAD_BUCKETS.to_vec()),
                &["model"],
            )
            .expect("valid metric"),
            vllm_info: GaugeVec::new(
                Opts::new(
                    names::VLLM_LORA_REQUESTS_INFO,
                    "Running stats on LoRA requests (vLLM's alias)",
                ),
                &["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
            )
            .expect("valid metric"),
        };
        for c in [
            Box::new(m.running.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.waiting.clone()),
            Box::new(m.loads.clone()),
            Box::new(m.evictions.clone()),
            Box::new(m.load_seconds.clone()),
            Box::new(m.vllm_info.clone()),
        ] {
            registry.register(c).expect("unique metric names");
        }
        m
    }

    /// Counts a load of `adapter` that took `took`.
    pub fn loaded(&self, adapter: &str, took: Duration) {
        self.loads.with_label_values(&[&self.model, adapter]).inc();
        self.load_seconds
            .with_label_values(&[&self.model])
            .observe(took.as_secs_f64());
    }

    /// Counts an eviction of `adapter`.
    pub fn evicted(&self, adapter: &str) {
        self.evictions.with_label_values(&[&self.model, adapter]).inc();
    }

    /// Sets the request gauges from the step loop's per-adapter counts.
    pub fn refresh(&self, counts: &[AdapterCount]) {
        self.running.reset();
        self.waiting.reset();
        self.vllm_info.reset();
        let mut running = Vec::new();
        let mut waiting = Vec::new();
        for c in counts {
            let labels = [self.model.as_str(), c.name.as_str()];
            self.running.with_label_values(&labels).set(c.running as i64);
            self.waiting.with_label_values(&labels).set(c.waiting as i64);
            if c.running > 0 {
                running.push(c.name.as_str());
            }
            if c.waiting > 0 {
                waiting.push(c.name.as_str());
            }
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.vllm_info
            .with_label_values(&[
                &running.join(","),
                &waiting.join(","),
                &self.max_loras.to_string(),
            ])
            .set(now);
    }
}
