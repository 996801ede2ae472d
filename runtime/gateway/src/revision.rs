//! What one attempt on a pod tells about the pod's revision — what the operator's canary analysis reads:
//! the verdict (`modelfleet_gateway_revision_requests_total`), the time to the first body byte and,
//! for streamed answers, the time between consecutive SSE `data:` events.
//!
//! The verdict is the revision's, not the client's: `error` is a 5xx answer, or a connection or stream
//! that broke or went silent before the answer was complete; any other answer (4xx, 429 included) is
//! `ok`. An attempt that never reached the pod (connection refused) and an answer its client abandoned
//! are not judged. Several events read in one chunk share the time since the previous chunk evenly.
//!
//! Invariants: at most one verdict per attempt; pods without a known revision (no rollout status, no
//! revision label) are not measured; memory is bounded (the SSE line reader keeps a short prefix).

use crate::fleet::{DeploymentId, Pod};
use crate::limits::meter::Meter;
use crate::metrics::Metrics;
use axum::http::StatusCode;
use prometheus::Histogram;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One attempt's measurements for its pod's revision.
pub struct Probe {
    metrics: Arc<Metrics>,
    /// namespace, model_deployment, revision; `None`: not measured.
    labels: Option<[String; 3]>,
    mirrored: bool,
    events: Meter,
    last_event: Option<Instant>,
    /// The revision's ITL histogram, once an answer streamed.
    itl: Option<Histogram>,
    done: bool,
}

/// Whether `status` counts as the revision answering well.
pub fn status_ok(status: StatusCode) -> bool {
    !status.is_server_error()
}

impl Probe {
    /// Measures an attempt of deployment `id` on `pod` (`mirrored`: a shadow copy).
    pub fn new(metrics: Arc<Metrics>, id: &DeploymentId, pod: &Pod, mirrored: bool) -> Probe {
        let labels =
            (!pod.revision.is_empty()).then(|| [id.namespace.clone(), id.name.clone(), pod.revision.clone()]);
        Probe {
            metrics,
            labels,
            mirrored,
            events: Meter::default(),
            last_event: None,
            itl: None,
            done: false,
        }
    }

    fn labels(&self) -> Option<[&str; 3]> {
        self.labels
            .as_ref()
            .map(|[ns, md, rev]| [ns.as_str(), md.as_str(), rev.as_str()])
    }

    /// The first body byte of a 2xx answer came `after` the request was sent.
    pub fn first_byte(&self, after: Duration) {
        if let Some(l) = self.labels() {
            self.metrics
                .revisions
                .ttft
                .with_label_values(&l)
                .observe(after.as_secs_f64());
        }
    }

    /// Reads the next bytes of a streamed (SSE) answer, timing its `data:` events.
    pub fn streamed(&mut self, chunk: &[u8]) {
        if self.labels.is_none() {
            return;
        }
        let before = self.events.events;
        self.events.feed(chunk);
        let new = self.events.events - before;
        if new == 0 {
            return;
        }
        let now = Instant::now();
        if let Some(last) = self.last_event.replace(now) {
            let gap = now.duration_since(last).as_secs_f64() / new as f64;
            let itl = match self.itl.take() {
                Some(h) => h,
                None => self
                    .metrics
                    .revisions
                    .itl
                    .with_label_values(&self.labels().unwrap_or_default()),
            };
            for _ in 0..new {
                itl.observe(gap);
            }
            self.itl = Some(itl);
        }
    }

    /// The revision's verdict on this attempt (once; later calls do nothing).
    pub fn finish(&mut self, ok: bool) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        if let Some([ns, md, rev]) = self.labels() {
            let outcome = if ok { "ok" } else { "error" };
            let mirrored = if self.mirrored { "true" } else { "false" };
            self.metrics
                .revisions
                .requests
                .with_label_values(&[ns, md, rev, outcome, mirrored])
                .inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(m: &Arc<Metrics>, revision: &str) -> Probe {
        let id = DeploymentId {
            namespace: "ns".into(),
            name: "chat".into(),
        };
        let pod = Pod {
            name: "p".into(),
            ip: "127.0.0.1".into(),
            revision: revision.into(),
        };
        Probe::new(m.clone(), &id, &pod, true)
    }

    #[test]
    fn one_verdict_per_attempt_and_events_are_timed() {
        let m = Arc::new(Metrics::new());
        let mut p = probe(&m, "r2");
        p.first_byte(Duration::from_millis(30));
        p.streamed(b"data: {\"a\":1}\n\nda");
        p.streamed(b"ta: {\"b\":2}\n\ndata: {\"c\":3}\n\n: comment\n\ndata: [DONE]\n\n");
        p.finish(false);
        p.finish(true);
        let l = ["ns", "chat", "r2"];
        assert_eq!(m.revisions.ttft.with_label_values(&l).get_sample_count(), 1);
        // Three events: the first starts the clock, the two after it are timed.
        assert_eq!(m.revisions.itl.with_label_values(&l).get_sample_count(), 2);
        let errors = m
            .revisions
            .requests
            .with_label_values(&["ns", "chat", "r2", "error", "true"]);
        assert_eq!(errors.get(), 1);
        let text = m.render();
        assert!(!text.contains("outcome=\"ok\""), "{text}");
    }

    #[test]
    fn pods_without_a_revision_are_not_measured() {
        let m = Arc::new(Metrics::new());
        let mut p = probe(&m, "");
        p.first_byte(Duration::from_millis(30));
        p.streamed(b"data: 1\n\ndata: 2\n\n");
        p.finish(true);
        assert!(!m.render().contains("revision="));
        assert!(status_ok(StatusCode::TOO_MANY_REQUESTS) && !status_ok(StatusCode::BAD_GATEWAY));
    }
}
