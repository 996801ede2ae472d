//! The export counters as Prometheus counters, for each binary's `/metrics`:
//! `modelfleet_trace_spans_exported_total`, `modelfleet_trace_spans_dropped_total` (the queue was
//! full: a slow or unreachable collector) and `modelfleet_trace_export_failures_total` (batches the
//! collector refused or did not answer in time).

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use std::sync::atomic::Ordering;

/// Reads [`crate::counters`] at each scrape.
#[derive(Debug)]
pub struct TraceMetrics {
    descs: Vec<Desc>,
}

const METRICS: [(&str, &str); 3] = [
    (
        "modelfleet_trace_spans_exported_total",
        "Spans the trace collector accepted.",
    ),
    (
        "modelfleet_trace_spans_dropped_total",
        "Spans dropped because the export queue was full (a slow or unreachable collector).",
    ),
    (
        "modelfleet_trace_export_failures_total",
        "Span batches the trace collector refused or did not answer in time.",
    ),
];

impl Default for TraceMetrics {
    fn default() -> Self {
        let descs = METRICS
            .iter()
            .filter_map(|(name, help)| {
                Desc::new(name.to_string(), help.to_string(), vec![], Default::default()).ok()
            })
            .collect();
        Self { descs }
    }
}

impl Collector for TraceMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let c = crate::counters();
        let values = [
            c.exported.load(Ordering::Relaxed),
            c.dropped.load(Ordering::Relaxed),
            c.failed_batches.load(Ordering::Relaxed),
        ];
        METRICS
            .iter()
            .zip(values)
            .filter_map(|((name, help), v)| {
                let counter = prometheus::IntCounter::new(*name, *help).ok()?;
                counter.inc_by(v);
                counter.collect().into_iter().next()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_as_counters() {
        let r = prometheus::Registry::new();
        r.register(Box::new(TraceMetrics::default())).unwrap();
        crate::counters().dropped.fetch_add(3, Ordering::Relaxed);
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&r.gather(), &mut out)
            .unwrap();
        assert!(
            out.contains("# TYPE modelfleet_trace_spans_dropped_total counter"),
            "{out}"
        );
        assert!(out.contains("modelfleet_trace_spans_dropped_total 3"), "{out}");
    }
}
