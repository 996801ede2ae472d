//! A bounded HTTP/1.1 listener for axum routers: a cap on open connections, a deadline for each
//! request's headers, a cap on their size, and a graceful stop. `axum::serve` has none of these knobs,
//! so a slow or hostile client could hold connections and buffers without limit.
//!
//! Invariants: at most `max_connections` connections are served at once — one over the cap is accepted
//! and closed at once (the client learns immediately, nothing waits in an unbounded queue); a client
//! that does not finish a request's headers within `header_read_timeout` of their first byte (of
//! connecting, for the first) is disconnected; a keep-alive connection with nothing in flight is closed
//! after `idle_timeout`, which is longer than common clients' pool idle timeouts, so that clients,
//! not the server, close idle connections ([`deadline`] says why that matters); headers larger than
//! `max_header_bytes` are refused by hyper (431); after `shutdown` fires no connection is accepted, each
//! open one finishes its request in flight and closes, and [`serve`] returns once all have closed (the
//! caller bounds that wait). Request bodies are bounded by the handlers, which read them with a size
//! cap and a read deadline (see the gateway's `body.rs`), after authentication.
//!
//! [`Listeners`] is what both servers start with: the address from `--host` (else `$POD_IP`, else
//! loopback), two ports on it — the API and a second one for the operator and Prometheus (the runtime's
//! admin port, the gateway's metrics port) — each served with its own limits, and one stop for both
//! ([`Serving::stop`]), preceded by a drain ([`Serving::drain`]: answers close their connections, so
//! clients move to another replica before the listeners close); [`shutdown_signal`] is the
//! SIGTERM/SIGINT both wait for.

mod deadline;

use deadline::{Deadlines, Tracked, Watched};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// The default idle timeout, seconds: above the pool idle timeouts of the common HTTP clients
/// (reqwest, hyper-util and Go's `net/http` keep idle connections 90 s; nginx's keep-alive is 75 s).
pub const IDLE_TIMEOUT_SECS: u64 = 120;

/// The bounds of one listener.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections served at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Time a client has to send a request's complete headers, from their first byte.
    pub header_read_timeout: Duration,
    /// Time a keep-alive connection with nothing in flight stays open.
    pub idle_timeout: Duration,
    /// Largest request head (request line + headers), bytes (at least 8 KiB: hyper's minimum buffer).
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(IDLE_TIMEOUT_SECS),
            max_header_bytes: 64 << 10,
        }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes, then lets open connections
/// finish their request in flight and returns when all are closed.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    serve_draining(listener, app, limits, shutdown, Arc::default()).await
}

/// [`serve`], with every answer from the moment `draining` is set carrying `Connection: close`.
async fn serve_draining(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
    draining: Arc<AtomicBool>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut builder = http1::Builder::new();
    // hyper's header_read_timeout is also an idle timeout ([`deadline`]); the deadlines are ours.
    builder
        .timer(TokioTimer::new())
        .max_buf_size(limits.max_header_bytes.max(8 << 10))
        .keep_alive(true);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = &mut shutdown => break,
        };
        while connections.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            // Out of file descriptors or a connection reset before accept: back off briefly.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            drop(stream); // over the cap: closed at once
            continue;
        };
        let _ = stream.set_nodelay(true);
        let deadlines = Deadlines::new(limits.header_read_timeout, limits.idle_timeout);
        let service = Tracked {
            app: app.clone(),
            deadlines: deadlines.clone(),
            draining: draining.clone(),
        };
        let io = TokioIo::new(Watched {
            io: stream,
            deadlines: deadlines.clone(),
        });
        let conn = builder.serve_connection(io, service);
        connections.spawn(watch_connection(conn, deadlines, stop_rx.clone(), permit));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while connections.join_next().await.is_some() {}
}

/// Serves one connection until it closes, its deadline passes (then it is dropped: closed), or the
/// listener stops (then its request in flight finishes and it closes).
async fn watch_connection(
    conn: http1::Connection<TokioIo<Watched<tokio::net::TcpStream>>, Tracked>,
    deadlines: std::sync::Arc<Deadlines>,
    mut stop: watch::Receiver<bool>,
    _permit: tokio::sync::OwnedSemaphorePermit,
) {
    tokio::pin!(conn);
    let stopping = loop {
        let deadline = deadlines.deadline();
        let due = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            r = stop.wait_for(|s| *s) => break r.is_ok(),
            () = deadlines.changed() => {}
            () = due => if deadlines.expired() {
                return;
            },
        }
    };
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    let _ = conn.await;
}

/// The address to bind: `explicit` (`--host`), else `$POD_IP` (a pod's own IP from the downward API),
/// else 127.0.0.1.
pub fn host_or_pod_ip(explicit: Option<&str>) -> String {
    explicit
        .map(str::to_owned)
        .or_else(|| std::env::var("POD_IP").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "127.0.0.1".into())
}

/// Why the listeners could not be opened (the message names the flag or address).
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// `--host` is not an IP address.
    #[error("--host {0}: not an IP address")]
    Host(String),
    /// A port could not be bound.
    #[error("binding {what} {addr}: {source}")]
    Port {
        /// Which port (`the API port`, `the admin port`, …).
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS's reason.
        source: std::io::Error,
    },
}

/// The API port and a second one on the same address, bound and not yet served.
pub struct Listeners {
    /// The API's address.
    pub addr: SocketAddr,
    /// The second port's address (admin, or metrics).
    pub second_addr: SocketAddr,
    api: TcpListener,
    second: TcpListener,
}

impl Listeners {
    /// Binds `host:port` and `host:second_port`; `second` names the second port in errors.
    pub async fn bind(
        host: &str,
        port: u16,
        second_port: u16,
        second: &'static str,
    ) -> Result<Self, BindError> {
        let ip: std::net::IpAddr = host.parse().map_err(|_| BindError::Host(host.to_owned()))?;
        let open = |addr: SocketAddr, what: &'static str| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| BindError::Port { what, addr, source })
        };
        let api = open(SocketAddr::new(ip, port), "the API port").await?;
        let second = open(SocketAddr::new(ip, second_port), second).await?;
        Ok(Listeners {
            addr: api.local_addr().unwrap_or(SocketAddr::new(ip, port)),
            second_addr: second.local_addr().unwrap_or(SocketAddr::new(ip, second_port)),
            api,
            second,
        })
    }

    /// Serves `api` and `second` with their own limits until [`Serving::stop`].
    pub fn serve(self, api: (axum::Router, Limits), second: (axum::Router, Limits)) -> Serving {
        let (stop, rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|v| *v).await;
        };
        let draining = Arc::new(AtomicBool::new(false));
        let tasks = vec![
            tokio::spawn(serve_draining(
                self.api,
                api.0,
                api.1,
                stopped(rx.clone()),
                draining.clone(),
            )),
            tokio::spawn(serve_draining(
                self.second,
                second.0,
                second.1,
                stopped(rx),
                draining.clone(),
            )),
        ];
        Serving {
            stop,
            tasks,
            draining,
        }
    }
}

/// Both listeners, serving.
pub struct Serving {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    draining: Arc<AtomicBool>,
}

impl Serving {
    /// The replica is going away (SIGTERM): from now on every answer carries `Connection: close`, so
    /// each client's next request opens a new connection — to another replica, once endpoints dropped
    /// this one — instead of a kept-alive connection that [`Serving::stop`] would close under it.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Stops accepting on both ports; requests in flight get up to `grace` to finish. Whether they all
    /// did.
    pub async fn stop(self, grace: Duration) -> bool {
        let _ = self.stop.send(true);
        tokio::time::timeout(grace, async {
            for t in self.tasks {
                let _ = t.await;
            }
        })
        .await
        .is_ok()
    }
}

/// Resolves on SIGTERM (the kubelet's stop) or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(limits: Limits) -> (SocketAddr, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    "done"
                }),
            )
            .route("/fast", axum::routing::get(|| async { "fast" }));
        let (tx, mut rx) = watch::channel(false);
        let task = tokio::spawn(serve(listener, app, limits, async move {
            let _ = rx.wait_for(|v| *v).await;
        }));
        (addr, tx, task)
    }

    async fn get(addr: SocketAddr) -> std::io::Result<String> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn a_pair_serves_both_ports_and_stops_them_together() {
        let l = Listeners::bind("127.0.0.1", 0, 0, "the second port")
            .await
            .unwrap();
        let (a, b) = (l.addr, l.second_addr);
        assert_ne!(a.port(), b.port());
        let app = || {
            axum::Router::new().route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    "done"
                }),
            )
        };
        let serving = l.serve((app(), Limits::default()), (app(), Limits::default()));
        let in_flight = tokio::spawn(get(a));
        assert!(get(b).await.unwrap().ends_with("done"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            serving.stop(Duration::from_secs(5)).await,
            "stopped within the grace"
        );
        assert!(
            in_flight.await.unwrap().unwrap().ends_with("done"),
            "the request in flight finished"
        );
        assert!(TcpStream::connect(a).await.is_err() && TcpStream::connect(b).await.is_err());
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = taken.local_addr().unwrap().port();
        let e = Listeners::bind("127.0.0.1", 0, port, "the admin port")
            .await
            .err()
            .unwrap();
        assert!(
            e.to_string().starts_with("binding the admin port 127.0.0.1:"),
            "{e}"
        );
        assert!(
            Listeners::bind("not-an-ip", 0, 0, "x")
                .await
                .err()
                .unwrap()
                .to_string()
                .contains("--host")
        );
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_at_once() {
        let (addr, _tx, _task) = start(Limits {
            max_connections: 2,
            ..Limits::default()
        })
        .await;
        let a = tokio::spawn(get(addr));
        let b = tokio::spawn(get(addr));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t0 = std::time::Instant::now();
        let third = get(addr).await.unwrap_or_default();
        assert!(third.is_empty(), "the third connection was served: {third}");
        assert!(t0.elapsed() < Duration::from_millis(200), "refused late");
        assert!(a.await.unwrap().unwrap().contains("done"));
        assert!(b.await.unwrap().unwrap().contains("done"));
        // Capacity is back once they closed.
        assert!(get(addr).await.unwrap().contains("done"));
    }

    #[tokio::test]
    async fn slow_headers_are_cut_off() {
        let (addr, _tx, _task) = start(Limits {
            header_read_timeout: Duration::from_millis(200),
            ..Limits::default()
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        let mut buf = Vec::new();
        let t0 = std::time::Instant::now();
        let read = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "the connection stayed open");
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(!String::from_utf8_lossy(&buf).contains("done"));
    }

    /// One request on a kept-alive connection: the answer's body, or None when the server closed it.
    async fn keep_alive_get(s: &mut TcpStream) -> Option<String> {
        s.write_all(b"GET /fast HTTP/1.1\r\nhost: x\r\n\r\n").await.ok()?;
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = s.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).to_string();
            if let Some((_, body)) = text.split_once("\r\n\r\n")
                && body.len() >= 4
            {
                return Some(body.to_string());
            }
        }
    }

    async fn closed(s: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(within, s.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn an_idle_connection_outlives_the_header_deadline_until_the_idle_timeout() {
        let (addr, _tx, _task) = start(Limits {
            header_read_timeout: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(1500),
            ..Limits::default()
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert_eq!(keep_alive_get(&mut s).await.as_deref(), Some("fast"));
        // Idle for three header deadlines: hyper's own timeout would have closed it by now.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            keep_alive_get(&mut s).await.as_deref(),
            Some("fast"),
            "the idle connection was closed at the header deadline"
        );
        let t0 = std::time::Instant::now();
        assert!(closed(&mut s, Duration::from_secs(5)).await, "never closed");
        let after = t0.elapsed();
        assert!(
            after >= Duration::from_millis(1300) && after < Duration::from_secs(3),
            "closed {after:?} after going idle"
        );
    }

    #[tokio::test]
    async fn headers_begun_after_an_idle_spell_are_due_from_their_first_byte() {
        let (addr, _tx, _task) = start(Limits {
            header_read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(30),
            ..Limits::default()
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert_eq!(keep_alive_get(&mut s).await.as_deref(), Some("fast"));
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.write_all(b"GET /fast HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        let t0 = std::time::Instant::now();
        assert!(
            closed(&mut s, Duration::from_secs(5)).await,
            "unfinished headers kept it open"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "not the idle timeout: {:?}",
            t0.elapsed()
        );
    }

    #[tokio::test]
    async fn a_slow_answer_is_not_cut_by_either_deadline() {
        let (addr, _tx, _task) = start(Limits {
            header_read_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(100),
            ..Limits::default()
        })
        .await;
        // /slow takes 300 ms: three of each deadline, all of it with a request in flight.
        assert!(get(addr).await.unwrap().ends_with("done"));
    }

    #[tokio::test]
    async fn a_draining_server_closes_each_connection_after_its_answer() {
        let l = Listeners::bind("127.0.0.1", 0, 0, "the second port")
            .await
            .unwrap();
        let addr = l.addr;
        let app = || axum::Router::new().route("/fast", axum::routing::get(|| async { "fast" }));
        let serving = l.serve((app(), Limits::default()), (app(), Limits::default()));
        let mut kept = TcpStream::connect(addr).await.unwrap();
        assert_eq!(keep_alive_get(&mut kept).await.as_deref(), Some("fast"));
        serving.drain();
        // The kept-alive connection's next answer is its last; a new connection is still served.
        assert_eq!(keep_alive_get(&mut kept).await.as_deref(), Some("fast"));
        assert!(
            closed(&mut kept, Duration::from_secs(2)).await,
            "kept open while draining"
        );
        let mut fresh = TcpStream::connect(addr).await.unwrap();
        fresh
            .write_all(b"GET /fast HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        fresh.read_to_string(&mut answer).await.unwrap();
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
        assert!(answer.ends_with("fast"), "{answer}");
        assert!(serving.stop(Duration::from_secs(2)).await);
    }

    #[tokio::test]
    async fn oversized_headers_are_refused() {
        let (addr, _tx, _task) = start(Limits {
            max_header_bytes: 8 << 10,
            ..Limits::default()
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let big = "a".repeat(20 << 10);
        let _ = s
            .write_all(format!("GET /slow HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n").as_bytes())
            .await;
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut buf)).await;
        let text = String::from_utf8_lossy(&buf);
        assert!(!text.contains("done"), "{text}");
        assert!(text.is_empty() || text.starts_with("HTTP/1.1 431"), "{text}");
    }

    #[tokio::test]
    async fn shutdown_finishes_requests_in_flight() {
        let (addr, tx, task) = start(Limits::default()).await;
        let inflight = tokio::spawn(get(addr));
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send(true).unwrap();
        assert!(inflight.await.unwrap().unwrap().contains("done"));
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("serve returns once connections closed")
            .unwrap();
        assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
    }
}
