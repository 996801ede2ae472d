//! One connection's deadlines: a request's headers must arrive within `header_read_timeout` of its
//! first byte (of the connection's opening, for the first request), and a keep-alive connection with
//! nothing in flight is closed after `idle_timeout`. hyper's own `header_read_timeout` cannot tell
//! the two apart: it starts as soon as a response has been written, so it also closes every idle
//! keep-alive connection after the header deadline — and a client whose pool keeps idle connections
//! longer (reqwest, hyper-util and Go keep them 90 s) that sends on one at that instant gets
//! "connection closed before message completed". Here the idle timeout is its own, longer than the
//! usual clients' pool timeouts, so a client closes an idle connection before the server does.
//!
//! How the phases are seen: [`Watched`] (the socket) notes the first byte read while the connection
//! is idle; [`Tracked`] (the service) marks it busy from a request's call until its response body is
//! dropped (written, or abandoned). The connection's task sleeps until [`Deadlines::deadline`] and
//! closes the connection when [`Deadlines::expired`] says so.

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Reading a request's headers, which must be complete by then.
    Head(Instant),
    /// Requests in flight (their responses not yet written): no deadline here.
    Busy(usize),
    /// Nothing in flight; closed at this instant unless a byte arrives.
    Idle(Instant),
}

/// The phase of one connection and when it ends.
#[derive(Debug)]
pub struct Deadlines {
    phase: Mutex<Phase>,
    changed: Notify,
    header: Duration,
    idle: Duration,
}

impl Deadlines {
    /// A connection just accepted: its first request's headers are due within `header`.
    pub fn new(header: Duration, idle: Duration) -> Arc<Self> {
        Arc::new(Deadlines {
            phase: Mutex::new(Phase::Head(Instant::now() + header)),
            changed: Notify::new(),
            header,
            idle,
        })
    }

    fn set(&self, f: impl FnOnce(Phase) -> Phase) {
        let mut phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        let next = f(*phase);
        if next != *phase {
            *phase = next;
            self.changed.notify_one();
        }
    }

    /// When the connection is to be closed as things stand (none while a request is in flight).
    pub fn deadline(&self) -> Option<Instant> {
        match *self.phase.lock().unwrap_or_else(|e| e.into_inner()) {
            Phase::Head(at) | Phase::Idle(at) => Some(at),
            Phase::Busy(_) => None,
        }
    }

    /// Whether the current phase's deadline has passed.
    pub fn expired(&self) -> bool {
        self.deadline().is_some_and(|at| Instant::now() >= at)
    }

    /// Resolves when the phase changed since the last call (then read [`Deadlines::deadline`] again).
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Bytes arrived: on an idle connection, a request's headers have begun.
    fn bytes_arrived(&self) {
        let header = self.header;
        self.set(|p| match p {
            Phase::Idle(_) => Phase::Head(Instant::now() + header),
            p => p,
        });
    }

    /// A request's headers are in: busy until the returned guard drops with its response.
    fn request(self: &Arc<Self>) -> InFlight {
        self.set(|p| match p {
            Phase::Busy(n) => Phase::Busy(n + 1),
            _ => Phase::Busy(1),
        });
        InFlight(self.clone())
    }
}

/// One request in flight on a connection; dropped with its response body.
#[derive(Debug)]
struct InFlight(Arc<Deadlines>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let idle = self.0.idle;
        self.0.set(|p| match p {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle(Instant::now() + idle),
        });
    }
}

/// A socket that tells its [`Deadlines`] when bytes arrive.
pub struct Watched<S> {
    /// The socket.
    pub io: S,
    /// Its connection's deadlines.
    pub deadlines: Arc<Deadlines>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.deadlines.bytes_arrived();
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The router as one connection's hyper service: each request busy until its response body drops;
/// once `draining`, every answer closes its connection (`Connection: close`).
#[derive(Clone)]
pub struct Tracked {
    /// The application.
    pub app: axum::Router,
    /// Its connection's deadlines.
    pub deadlines: Arc<Deadlines>,
    /// Set when the server is going away.
    pub draining: Arc<AtomicBool>,
}

type Answer = Pin<Box<dyn Future<Output = Result<hyper::Response<Body>, Infallible>> + Send>>;

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = hyper::Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        let in_flight = self.deadlines.request();
        let mut app = self.app.clone();
        let draining = self.draining.clone();
        Box::pin(async move {
            let mut resp = tower_service::Service::call(&mut app, req).await?;
            if draining.load(Ordering::SeqCst) {
                let close = hyper::header::HeaderValue::from_static("close");
                resp.headers_mut().insert(hyper::header::CONNECTION, close);
            }
            Ok(resp.map(|inner| {
                Body::new(Guarded {
                    inner,
                    _in_flight: in_flight,
                })
            }))
        })
    }
}

/// A response body that holds its request's [`InFlight`] until hyper is done with it.
struct Guarded {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
