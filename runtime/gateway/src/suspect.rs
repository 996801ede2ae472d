//! When a pod's connection breaks after a request was sent to it: did the pod go away (its process
//! died — perhaps of this very request) or only the connection? A request that may have killed a pod
//! is never sent to another one, and is logged so an operator can find it.
//!
//! A reset is not proof that the pod never started the request, and a request that crashes a pod's
//! process (a poison request) resets every connection to it. So the proxy asks the pod again: after a
//! short pause (the dying process's listener closes a moment after its connections), a `GET /health`
//! on its API port. A pod that answers is alive: the break was the connection's, and the request may
//! be tried once more elsewhere. A pod that does not has gone away, and the request stays with it.
//!
//! Invariants: the log line names the deployment, tenant, pod, path and a SHA-256 prefix of the body —
//! never the body, a prompt or a key.

use crate::fleet::Pod;
use crate::state::Gateway;
use sha2::{Digest, Sha256};
use std::time::Duration;

/// Pause before asking a pod whose connection broke whether it is still there.
pub const SETTLE: Duration = Duration::from_millis(200);
/// How long the pod has to answer `/health`.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether `pod` is gone: its `/health` does not answer 200 within [`PROBE_TIMEOUT`] after [`SETTLE`].
pub async fn pod_gone(gw: &Gateway, pod: &Pod) -> bool {
    tokio::time::sleep(SETTLE).await;
    let url = format!("http://{}:{}/health", pod.ip, gw.settings.pod_port);
    let answered = tokio::time::timeout(PROBE_TIMEOUT, gw.client.get(url).send()).await;
    !matches!(answered, Ok(Ok(r)) if r.status().is_success())
}

/// The first 16 hex digits of SHA-256 over the path and the body: enough to find a request in a
/// client's logs, nothing of its content.
pub fn request_hash(path: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(path.as_bytes());
    h.update([0]);
    h.update(body);
    h.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// What was known about a request whose pod went away while handling it.
pub struct Suspect<'a> {
    /// The deployment's namespace.
    pub namespace: &'a str,
    /// The deployment's name.
    pub deployment: &'a str,
    /// The authenticated tenant.
    pub tenant: &'a str,
    /// The pod.
    pub pod: &'a str,
    /// `/v1/chat/completions` or `/v1/completions`.
    pub path: &'a str,
    /// The request body (hashed, never logged).
    pub body: &'a [u8],
    /// `before_first_byte` or `streaming`.
    pub phase: &'a str,
}

/// Logs a request that was on a pod when it went away (a warning: it may be a poison request).
pub fn report(s: &Suspect) {
    tracing::warn!(
        namespace = %s.namespace,
        model_deployment = %s.deployment,
        tenant = %s.tenant,
        pod = %s.pod,
        path = %s.path,
        request_sha256 = %request_hash(s.path, s.body),
        phase = %s.phase,
        "a replica went away while handling this request; it was not retried (it may be what made \
         the replica fail)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_name_the_request_not_its_content() {
        let a = request_hash("/v1/completions", b"{\"prompt\":\"secret\"}");
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, request_hash("/v1/completions", b"{\"prompt\":\"secret\"}"));
        assert_ne!(
            a,
            request_hash("/v1/chat/completions", b"{\"prompt\":\"secret\"}")
        );
    }
}
