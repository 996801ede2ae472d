//! Logs and traces for every modelfleet binary (operator, gateway, runtime): one `tracing` subscriber
//! that writes log lines (text or JSON) and, when an OTLP endpoint is configured, exports spans over
//! OTLP/HTTP (protobuf) through [`export::BoundedExport`].
//!
//! Invariants:
//! - Tracing is off unless an endpoint is set (`--otlp-traces-endpoint`, or the standard
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`); off, no span is exported and
//!   no thread is started.
//! - Ending a span never blocks a request: the export queue is bounded and drops (counted).
//! - Sampling is parent-based: a caller's sampled `traceparent` is always honoured, a new trace is
//!   sampled with the configured ratio.
//! - Log lines never carry API keys, tokens or prompt text (the callers' rule; nothing here adds any).

pub mod export;
pub mod genai;
pub mod metrics;
pub mod propagation;

use clap::{Args, ValueEnum};
use export::{BoundedExport, ExportCounters};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `key=value` text, one line per event, with the fields of the spans it happened in.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `spans` with the request's `trace_id`).
    Json,
}

/// The flags every binary takes (each also reads the standard `OTEL_*` variables).
#[derive(Args, Clone, Debug, Default)]
pub struct TelemetryArgs {
    /// Export traces over OTLP/HTTP (protobuf) to this collector: its base URL (`http://otel:4318`, to
    /// which `/v1/traces` is added) or the full traces URL. Unset: the standard
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`; neither: no traces.
    #[arg(long, env = "MODELFLEET_OTLP_TRACES_ENDPOINT")]
    pub otlp_traces_endpoint: Option<String>,

    /// The share of new traces sampled (0.0–1.0); a caller's sampling decision (its `traceparent`) is
    /// always followed. The standard `OTEL_TRACES_SAMPLER_ARG` is read when this flag is unset.
    #[arg(long, env = "MODELFLEET_TRACE_SAMPLE_RATIO", value_parser = parse_ratio)]
    pub trace_sample_ratio: Option<f64>,

    /// Spans held for export at most; more are dropped (and counted) rather than slow a request.
    #[arg(long, env = "MODELFLEET_TRACE_QUEUE", default_value_t = 4096)]
    pub trace_queue: usize,

    /// Log line format on stderr.
    #[arg(long, env = "MODELFLEET_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("must be a number from 0.0 to 1.0, got {s:?}")),
    }
}

impl TelemetryArgs {
    /// The traces URL to export to, if tracing is on. `None` lets the exporter read the standard
    /// variables itself (`Some(None)`): the outer option says whether tracing is on at all.
    fn endpoint(&self) -> Option<Option<String>> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return None;
        }
        if let Some(url) = self
            .otlp_traces_endpoint
            .as_deref()
            .filter(|u| !u.trim().is_empty())
        {
            return Some(Some(traces_url(url)));
        }
        (env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() || env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some())
            .then_some(None)
    }

    fn ratio(&self) -> f64 {
        self.trace_sample_ratio
            .or_else(|| {
                std::env::var("OTEL_TRACES_SAMPLER_ARG")
                    .ok()
                    .and_then(|s| parse_ratio(&s).ok())
            })
            .unwrap_or(1.0)
    }
}

/// `http://host:4318` → `http://host:4318/v1/traces`; a URL with a path is kept as it is.
pub fn traces_url(url: &str) -> String {
    let url = url.trim();
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    match rest.find('/') {
        Some(i) if !rest[i..].trim_end_matches('/').is_empty() => url.to_string(),
        _ => format!("{}/v1/traces", url.trim_end_matches('/')),
    }
}

static COUNTERS: OnceLock<Arc<ExportCounters>> = OnceLock::new();

/// The export counters (all zero while tracing is off), for `/metrics`.
pub fn counters() -> &'static ExportCounters {
    COUNTERS.get_or_init(Default::default)
}

/// What [`init`] set up; [`Telemetry::shutdown`] sends the spans still queued.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    /// Why tracing is off although asked for (a bad endpoint): logged once the subscriber is up.
    pub warning: Option<String>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn tracing(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is queued, waiting at most `timeout`. Blocking: call it off the async workers
    /// (`spawn_blocking`) or after they stopped.
    pub fn shutdown(&self, timeout: Duration) {
        if let Some(p) = &self.provider {
            let _ = p.shutdown_with_timeout(timeout);
        }
    }
}

/// Installs the subscriber for `service` (once per process; later calls only return a handle that
/// exports nothing). `RUST_LOG` filters log lines (default `info`); spans are exported whatever the
/// filter says about log lines at their level, down to `info`.
pub fn init(service: &'static str, args: &TelemetryArgs) -> Telemetry {
    let (provider, warning) = match args.endpoint() {
        None => (None, None),
        Some(url) => match provider(service, url, args) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(format!("traces are off: {e}"))),
        },
    };
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = match args.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // Colour only on a terminal: in a container, escape codes land in `kubectl logs`.
            .with_ansi(ansi)
            // The default reports a failed write with `eprintln!`, which panics when stderr is closed.
            .log_internal_errors(false)
            .with_filter(filter())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_current_span(false)
            .with_span_list(true)
            .log_internal_errors(false)
            .with_filter(filter())
            .boxed(),
    };
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(service))
            .with_tracked_inactivity(false)
            .with_threads(false)
            // Spans carry what they mean, not where in our source they were opened.
            .with_location(false)
            .with_target(false)
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    let installed = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .is_ok();
    let provider = provider.filter(|_| installed);
    if let Some(p) = &provider {
        opentelemetry::global::set_tracer_provider(p.clone());
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
    }
    Telemetry { provider, warning }
}

fn provider(
    service: &'static str,
    url: Option<String>,
    args: &TelemetryArgs,
) -> Result<SdkTracerProvider, String> {
    // The exporter's client is reqwest with rustls and no provider of its own: ours (ring) first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary);
    if let Some(url) = url {
        builder = builder.with_endpoint(url);
    }
    if std::env::var_os("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT").is_none()
        && std::env::var_os("OTEL_EXPORTER_OTLP_TIMEOUT").is_none()
    {
        builder = builder.with_timeout(Duration::from_secs(5));
    }
    let exporter = builder.build().map_err(|e| e.to_string())?;
    let counters = COUNTERS.get_or_init(Default::default).clone();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service_name(service))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(BoundedExport::start(exporter, args.trace_queue, counters))
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            args.ratio(),
        ))))
        .with_resource(resource)
        .build())
}

/// `OTEL_SERVICE_NAME` if set, else the binary's own name.
fn service_name(default: &'static str) -> String {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// Records a finished span that was timed elsewhere (e.g. on the engine thread): `name`, from `start`
/// to `end`, a child of `parent`. Nothing happens when tracing is off or `parent` is not sampled.
pub fn past_span(
    parent: &tracing::Span,
    name: &'static str,
    start: std::time::SystemTime,
    end: std::time::SystemTime,
    attributes: Vec<opentelemetry::KeyValue>,
) {
    use opentelemetry::trace::{Span as _, Tracer as _};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = parent.context();
    if !cx.span().span_context().is_sampled() {
        return;
    }
    let tracer = opentelemetry::global::tracer("modelfleet");
    let mut span = tracer
        .span_builder(name)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(&tracer, &cx);
    span.end_with_timestamp(end.max(start));
}

/// The trace id of `span` (32 hex digits) if it is part of a trace: its exported context, or else
/// the caller's `remote` context (tracing off, but the caller sent a `traceparent`: logs still join).
pub fn trace_id(span: &tracing::Span, remote: &opentelemetry::Context) -> Option<String> {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let own = span.context();
    [
        own.span().span_context().clone(),
        remote.span().span_context().clone(),
    ]
    .into_iter()
    .find(|c| c.is_valid())
    .map(|c| c.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_url_adds_the_signal_path_only_to_a_base() {
        assert_eq!(traces_url("http://otel:4318"), "http://otel:4318/v1/traces");
        assert_eq!(traces_url("http://otel:4318/"), "http://otel:4318/v1/traces");
        assert_eq!(
            traces_url("http://otel:4318/v1/traces"),
            "http://otel:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://c.example/otlp/traces"),
            "https://c.example/otlp/traces"
        );
    }

    #[test]
    fn ratio_is_checked() {
        assert_eq!(parse_ratio("0.25"), Ok(0.25));
        assert!(parse_ratio("1.5").unwrap_err().contains("0.0 to 1.0"));
        assert!(parse_ratio("x").is_err());
    }
}
