//! The span processor every binary exports through: a bounded queue and one export thread.
//!
//! Invariant: ending a span never waits. `on_end` puts the span in a queue of fixed size and returns; a
//! span that finds the queue full is dropped and counted (`spans_dropped`), so a collector that is
//! down, slow or unreachable costs a request nothing but the span. The export thread sends batches
//! (up to `MAX_BATCH` spans, or whatever is queued after `FLUSH_EVERY`) with the exporter's own client
//! and timeout; shutdown waits for the last batch at most the time it is given, then lets the thread go.

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Spans sent to the collector in one request, at most.
const MAX_BATCH: usize = 512;
/// How long a span waits in the queue for others to fill a batch.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// What the export thread has done, for the binaries' `/metrics`.
#[derive(Debug, Default)]
pub struct ExportCounters {
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Spans dropped because the queue was full (a slow or unreachable collector).
    pub dropped: AtomicU64,
    /// Batches the collector refused or never answered (their spans are lost, not retried).
    pub failed_batches: AtomicU64,
}

enum Msg {
    Span(Box<SpanData>),
    /// Export what is queued now, then answer.
    Flush(SyncSender<()>),
}

/// A [`SpanProcessor`] with a bounded queue that drops rather than blocks.
#[derive(Debug)]
pub struct BoundedExport {
    tx: SyncSender<Msg>,
    /// Control messages (flush, shutdown) do not compete with spans for the queue's room.
    control: SyncSender<Msg>,
    stopping: Arc<AtomicBool>,
    counters: Arc<ExportCounters>,
    resource: Arc<Mutex<Option<Resource>>>,
}

impl BoundedExport {
    /// Starts the export thread for `exporter`, with room for `queue` spans.
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        queue: usize,
        counters: Arc<ExportCounters>,
    ) -> Self {
        let (tx, rx) = mpsc::sync_channel(queue.max(1));
        let (control, control_rx) = mpsc::sync_channel(4);
        let stopping = Arc::new(AtomicBool::new(false));
        let resource = Arc::new(Mutex::new(None));
        let worker = Worker {
            exporter,
            spans: rx,
            control: control_rx,
            stopping: stopping.clone(),
            counters: counters.clone(),
            resource: resource.clone(),
        };
        // If the thread cannot start, spans are dropped and counted: tracing never stops the binary.
        let _ = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || worker.run());
        Self {
            tx,
            control,
            stopping,
            counters,
            resource,
        }
    }

    fn flush_within(&self, timeout: Duration) -> OTelSdkResult {
        let (done, wait) = mpsc::sync_channel(1);
        if self.control.try_send(Msg::Flush(done)).is_err() {
            return Err(OTelSdkError::InternalFailure(
                "the export thread is busy or gone".into(),
            ));
        }
        // The export thread only looks at control messages between spans: wake it.
        let _ = self.tx.try_send(Msg::Flush(mpsc::sync_channel(1).0));
        wait.recv_timeout(timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

impl SpanProcessor for BoundedExport {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() || self.stopping.load(Ordering::Relaxed) {
            return;
        }
        match self.tx.try_send(Msg::Span(Box::new(span))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.flush_within(Duration::from_secs(5))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let result = self.flush_within(timeout);
        self.stopping.store(true, Ordering::Relaxed);
        result
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Ok(mut r) = self.resource.lock() {
            *r = Some(resource.clone());
        }
    }
}

struct Worker<E> {
    exporter: E,
    spans: Receiver<Msg>,
    control: Receiver<Msg>,
    stopping: Arc<AtomicBool>,
    counters: Arc<ExportCounters>,
    resource: Arc<Mutex<Option<Resource>>>,
}

impl<E: SpanExporter> Worker<E> {
    fn run(mut self) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut oldest: Option<Instant> = None;
        loop {
            self.take_resource();
            let wait = oldest.map_or(FLUSH_EVERY, |t| FLUSH_EVERY.saturating_sub(t.elapsed()));
            let mut flushes = Vec::new();
            match self.spans.recv_timeout(wait) {
                Ok(Msg::Span(span)) => {
                    oldest.get_or_insert_with(Instant::now);
                    batch.push(*span);
                }
                Ok(Msg::Flush(done)) => flushes.push(done),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            while let Ok(Msg::Flush(done)) = self.control.try_recv() {
                flushes.push(done);
            }
            if !flushes.is_empty() {
                // A flush exports everything queued before it.
                while batch.len() < MAX_BATCH * 4 {
                    match self.spans.try_recv() {
                        Ok(Msg::Span(span)) => batch.push(*span),
                        Ok(Msg::Flush(_)) => {}
                        Err(_) => break,
                    }
                }
            }
            let due = oldest.is_some_and(|t| t.elapsed() >= FLUSH_EVERY);
            if batch.len() >= MAX_BATCH || due || !flushes.is_empty() {
                for chunk in std::mem::take(&mut batch).chunks(MAX_BATCH) {
                    self.export(chunk.to_vec());
                }
                oldest = None;
            }
            for done in flushes {
                let _ = done.try_send(());
            }
            if self.stopping.load(Ordering::Relaxed) {
                // A last try for what is still queued (a shutdown that gave up waiting is not waiting
                // for this: the process may end first).
                let rest: Vec<SpanData> = std::iter::from_fn(|| self.spans.try_recv().ok())
                    .filter_map(|m| match m {
                        Msg::Span(s) => Some(*s),
                        Msg::Flush(_) => None,
                    })
                    .collect();
                batch.extend(rest);
                for chunk in std::mem::take(&mut batch).chunks(MAX_BATCH) {
                    self.export(chunk.to_vec());
                }
                break;
            }
        }
        let _ = self.exporter.shutdown();
    }

    fn take_resource(&mut self) {
        let fresh = self.resource.lock().ok().and_then(|mut r| r.take());
        if let Some(resource) = fresh {
            self.exporter.set_resource(&resource);
        }
    }

    fn export(&self, spans: Vec<SpanData>) {
        if spans.is_empty() {
            return;
        }
        let n = spans.len() as u64;
        // The exporter's client is blocking (this thread is ours): its future completes on first poll.
        match futures::executor::block_on(self.exporter.export(spans)) {
            Ok(()) => self.counters.exported.fetch_add(n, Ordering::Relaxed),
            Err(_) => self.counters.failed_batches.fetch_add(1, Ordering::Relaxed),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use std::borrow::Cow;
    use std::time::SystemTime;

    /// An exporter whose every export waits until the test opens `gate` (a collector that hangs).
    #[derive(Debug)]
    struct Hanging {
        gate: Arc<(Mutex<bool>, std::sync::Condvar)>,
        got: Arc<AtomicU64>,
    }

    impl SpanExporter for Hanging {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let (open, cv) = &*self.gate;
            let mut o = open.lock().unwrap();
            while !*o {
                o = cv.wait(o).unwrap();
            }
            self.got.fetch_add(batch.len() as u64, Ordering::Relaxed);
            Ok(())
        }
    }

    fn span(i: u64) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(u128::from(i) + 1),
                SpanId::from(i + 1),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed("s"),
            start_time: SystemTime::now(),
            end_time: SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[test]
    fn a_hung_collector_costs_spans_never_time_and_shutdown_is_bounded() {
        let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let got = Arc::new(AtomicU64::new(0));
        let counters = Arc::new(ExportCounters::default());
        let exporter = Hanging {
            gate: gate.clone(),
            got: got.clone(),
        };
        let p = BoundedExport::start(exporter, 8, counters.clone());
        // The first batch goes out after FLUSH_EVERY and hangs; everything after fills the queue.
        p.on_end(span(0));
        std::thread::sleep(FLUSH_EVERY + Duration::from_millis(300));
        let t = Instant::now();
        for i in 1..=1000 {
            p.on_end(span(i));
        }
        let spent = t.elapsed();
        assert!(spent < Duration::from_secs(5), "1000 ends took {spent:?}");
        let dropped = counters.dropped.load(Ordering::Relaxed);
        assert!(dropped >= 1000 - 8, "dropped {dropped}");
        // Shutdown waits at most what it is given, though the export never returns.
        let t = Instant::now();
        assert!(p.shutdown_with_timeout(Duration::from_millis(200)).is_err());
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "shutdown took {:?}",
            t.elapsed()
        );
        // The collector recovers: what was queued goes out, then the thread ends.
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        let t = Instant::now();
        while got.load(Ordering::Relaxed) < 1 + 1000 - dropped && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(got.load(Ordering::Relaxed), 1 + 1000 - dropped);
    }

    #[test]
    fn a_flush_sends_what_is_queued_at_once() {
        let gate = Arc::new((Mutex::new(true), std::sync::Condvar::new()));
        let got = Arc::new(AtomicU64::new(0));
        let counters = Arc::new(ExportCounters::default());
        let exporter = Hanging {
            gate,
            got: got.clone(),
        };
        let p = BoundedExport::start(exporter, 64, counters.clone());
        for i in 0..10 {
            p.on_end(span(i));
        }
        p.force_flush().unwrap();
        assert_eq!(got.load(Ordering::Relaxed), 10);
        assert_eq!(counters.exported.load(Ordering::Relaxed), 10);
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 0);
        p.shutdown().unwrap();
    }
}
