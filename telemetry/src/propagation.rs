//! W3C trace context (`traceparent`, `tracestate`) in and out of HTTP headers.
//!
//! Extraction works whether or not tracing is on (a caller's trace id still reaches the log lines);
//! injection writes the context of the span that is current where it is called.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The headers W3C trace context travels in.
pub const HEADERS: [&str; 2] = ["traceparent", "tracestate"];

struct Read<'a>(&'a HeaderMap);

impl Extractor for Read<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct Write<'a>(&'a mut HeaderMap);

impl Injector for Write<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// The caller's context from `headers` (empty if there is none, or it is malformed).
pub fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&Read(headers))
}

/// Writes `cx` into `headers` as `traceparent`/`tracestate`, replacing what was there. An invalid
/// (empty) context leaves the headers as they are, so a caller's own `traceparent` passes through a
/// hop that does not trace.
pub fn inject(cx: &Context, headers: &mut HeaderMap) {
    use opentelemetry::trace::TraceContextExt;
    if !cx.span().span_context().is_valid() {
        return;
    }
    for h in HEADERS {
        headers.remove(h);
    }
    TraceContextPropagator::new().inject_context(cx, &mut Write(headers));
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn a_callers_traceparent_round_trips() {
        let mut h = HeaderMap::new();
        h.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let cx = extract(&h);
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let mut out = HeaderMap::new();
        inject(&cx, &mut out);
        assert_eq!(
            out["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    #[test]
    fn malformed_or_missing_context_is_empty_and_injects_nothing() {
        let mut h = HeaderMap::new();
        h.insert("traceparent", "00-zz-00f067aa0ba902b7-01".parse().unwrap());
        let cx = extract(&h);
        assert!(!cx.span().span_context().is_valid());
        let mut out = HeaderMap::new();
        out.insert("traceparent", "kept".parse().unwrap());
        inject(&cx, &mut out);
        assert_eq!(out["traceparent"], "kept");
    }
}
