//! `mf-forward`: TCP forwards from this network namespace into another one.
//!
//! The real node of the local cluster lives in a network namespace of its own (e2e/README.md); the
//! host reaches its API server, registry, Prometheus and the gateway Service through loopback ports
//! this forwards. Each forward is `LISTEN=TARGET`: LISTEN is bound in the namespace the program
//! starts in, TARGET is dialled in the namespace given by `--netns` (or the same one without it).
//!
//! Invariants:
//! - Listening sockets are bound before the thread enters the target namespace; every thread the
//!   runtime starts afterwards inherits the target namespace, so every dial happens there and every
//!   accept stays where the listener was bound.
//! - TARGET is resolved at each connection: a Service that does not exist yet fails that connection
//!   only (the client sees it closed), never the forwarder.

use std::fs::File;
use std::net::TcpListener as StdListener;
use std::path::PathBuf;

use anyhow::{Context, bail};
use tokio::net::{TcpListener, TcpStream};

/// One forward: where to listen and what to dial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    /// `host:port` bound in the starting namespace.
    pub listen: String,
    /// `host:port` dialled in the target namespace.
    pub target: String,
}

impl std::str::FromStr for Forward {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Forward> {
        let Some((listen, target)) = s.split_once('=') else {
            bail!("{s:?}: expected LISTEN=TARGET, e.g. 127.0.0.1:6443=127.0.0.1:6443");
        };
        for part in [listen, target] {
            let port = part.rsplit_once(':').map(|(_, p)| p);
            if port.and_then(|p| p.parse::<u16>().ok()).is_none() {
                bail!("{s:?}: {part:?} needs host:port");
            }
        }
        Ok(Forward {
            listen: listen.to_string(),
            target: target.to_string(),
        })
    }
}

/// Binds every forward here, enters `netns` (if any), and serves until the process is stopped.
pub fn run(netns: Option<PathBuf>, forwards: Vec<Forward>) -> anyhow::Result<()> {
    let mut bound = Vec::with_capacity(forwards.len());
    for f in forwards {
        let l = StdListener::bind(&f.listen).with_context(|| format!("binding {}", f.listen))?;
        l.set_nonblocking(true)?;
        bound.push((l, f));
    }
    if let Some(path) = &netns {
        let ns = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("entering {}", path.display()))?;
    }
    // Built after setns: its worker and blocking threads are created from this thread and inherit
    // the target namespace.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut tasks = Vec::new();
        for (l, f) in bound {
            let l = TcpListener::from_std(l)?;
            tracing::info!(listen = %f.listen, target = %f.target, "forwarding");
            tasks.push(tokio::spawn(accept_loop(l, f.target)));
        }
        for t in tasks {
            t.await?;
        }
        Ok(())
    })
}

async fn accept_loop(listener: TcpListener, target: String) {
    loop {
        let (inbound, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let target = target.clone();
        tokio::spawn(async move {
            match TcpStream::connect(&target).await {
                Ok(outbound) => {
                    if let Err(e) = pipe(inbound, outbound).await {
                        tracing::warn!(%peer, %target, error = %e, "connection ended with an error");
                    }
                }
                Err(e) => tracing::warn!(%peer, %target, error = %e, "dial failed"),
            }
        });
    }
}

async fn pipe(mut a: TcpStream, mut b: TcpStream) -> std::io::Result<()> {
    let _ = a.set_nodelay(true);
    let _ = b.set_nodelay(true);
    tokio::io::copy_bidirectional(&mut a, &mut b).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_parse_and_name_what_is_wrong() {
        let f: Forward = "127.0.0.1:8080=10.96.0.80:80".parse().unwrap();
        assert_eq!(f.listen, "127.0.0.1:8080");
        assert_eq!(f.target, "10.96.0.80:80");
        let err = "127.0.0.1:8080".parse::<Forward>().unwrap_err().to_string();
        assert!(err.contains("LISTEN=TARGET"), "{err}");
        let err = "127.0.0.1=10.0.0.1:80"
            .parse::<Forward>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs host:port"), "{err}");
    }
}
