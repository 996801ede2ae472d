//! The runtime's admin API as the operator calls it: `POST /v1/adapters` (load, synchronous: fetch,
//! digest check, compatibility check, load) and `DELETE /v1/adapters/{name}` (unload) on
//! `http://<podIP>:8001`, with the bearer token from the deployment's admin Secret.
//!
//! Invariants: every call has a timeout (a load may download for tens of seconds, an unload is quick),
//! covering the answer's body too, and reads at most a capped body ([`crate::body`]), so a hung or
//! babbling pod costs one task its timeout and nothing else; the token never appears in a log, an
//! Event or a status message ([`AdminToken`]'s `Debug` hides it); errors become condition reasons in one
//! place ([`classify`]) from the OpenAI-shaped `error.code` the runtime returns.

use crate::body::{MAX_ADMIN_BYTES, read_capped};
use crate::builders::adapters::AdapterSpec;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// How long connecting to a pod may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest message kept from a pod's answer (the status field's limit).
pub const MAX_MESSAGE: usize = 1024;

/// How long each kind of call may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// A load: fetch + verify + load of a large adapter (default 120 s).
    pub load: Duration,
    /// An unload (default 15 s).
    pub unload: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            load: Duration::from_secs(120),
            unload: Duration::from_secs(15),
        }
    }
}

/// The admin bearer token. Shown as `<redacted>` by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(Arc<str>);

impl AdminToken {
    /// Wraps a token read from the admin Secret.
    pub fn new(token: String) -> Self {
        AdminToken(token.into())
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// Why a pod did not load an adapter — the condition reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The bytes did not match `spec.digest` (Verified=False).
    DigestMismatch,
    /// The adapter does not fit the base model or the pod's limits, or is not a valid PEFT adapter
    /// (Verified=False).
    Incompatible,
    /// Anything else: the source, the URI policy, the request, the network, the token (Ready=False).
    LoadFailed,
}

impl Reason {
    /// The condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::DigestMismatch => "DigestMismatch",
            Reason::Incompatible => "Incompatible",
            Reason::LoadFailed => "LoadFailed",
        }
    }

    /// Whether the verdict is about the artifact itself (retrying the same spec will not help).
    pub fn is_verification(self) -> bool {
        matches!(self, Reason::DigestMismatch | Reason::Incompatible)
    }
}

/// A failed admin call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminError {
    /// The condition reason.
    pub reason: Reason,
    /// What the pod (or the network) said, bounded by [`MAX_MESSAGE`].
    pub message: String,
}

/// The reason for an error answer: `status` and the `error.code` of its body.
pub fn classify(status: u16, code: Option<&str>) -> Reason {
    match (status, code) {
        (_, Some("digest_mismatch")) => Reason::DigestMismatch,
        (_, Some("incompatible" | "invalid_artifact")) => Reason::Incompatible,
        _ => Reason::LoadFailed,
    }
}

fn bounded(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// `error.code` and `error.message` of an OpenAI-shaped error body, if it is one.
fn parse_error(body: &str) -> (Option<String>, Option<String>) {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v["error"][name].as_str())
            .map(String::from)
    };
    (field("code"), field("message"))
}

/// The error for a non-success answer with `body`.
pub fn error_from_answer(status: u16, body: &str) -> AdminError {
    let (code, message) = parse_error(body);
    let code = code.as_deref();
    let message = message.unwrap_or_else(|| body.trim().chars().take(200).collect());
    let message = if status == 401 {
        "the pod refused the operator's admin token (401)".to_string()
    } else {
        match code {
            Some(code) => format!("{status} {code}: {message}"),
            None => format!("{status}: {message}"),
        }
    };
    AdminError {
        reason: classify(status, code),
        message: bounded(message),
    }
}

fn transport_error(e: reqwest::Error, timeout: Duration) -> AdminError {
    // Stable words (no addresses, no changing OS text) so a retry that fails the same way does not
    // rewrite the status.
    let message = if e.is_timeout() {
        format!("no answer from the admin API within {timeout:?}")
    } else if e.is_connect() {
        "cannot connect to the admin API".to_string()
    } else {
        format!("admin API request failed: {}", e.without_url())
    };
    AdminError {
        reason: Reason::LoadFailed,
        message: bounded(message),
    }
}

/// The HTTP client for admin calls (per-request timeouts are set by each call).
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .no_proxy()
        .build()
        .expect("an HTTP client without TLS builds")
}

/// `http://<ip>:<port>` (IPv6 addresses in brackets); runtime pods listen on
/// [`crate::labels::ADMIN_PORT`].
pub fn base_url(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("http://[{ip}]:{port}")
    } else {
        format!("http://{ip}:{port}")
    }
}

/// Percent-encodes a served name for one path segment (names may hold `/` and `:`).
pub fn path_segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Loads `entry` on the pod at `base` (201 newly loaded, 200 already loaded: both success).
pub async fn load(
    http: &reqwest::Client,
    base: &str,
    token: &AdminToken,
    entry: &AdapterSpec,
    timeout: Duration,
) -> Result<(), AdminError> {
    let answer = http
        .post(format!("{base}/v1/adapters"))
        .bearer_auth(&*token.0)
        .timeout(timeout)
        .json(entry)
        .send()
        .await
        .map_err(|e| transport_error(e, timeout))?;
    let status = answer.status().as_u16();
    if (200..300).contains(&status) {
        return Ok(());
    }
    let body = capped_text(answer).await;
    Err(error_from_answer(status, &body))
}

/// An error answer's body as text, at most [`MAX_ADMIN_BYTES`] of it (empty if it is longer).
async fn capped_text(answer: reqwest::Response) -> String {
    read_capped(answer, MAX_ADMIN_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Most bytes of a `GET /v1/adapters` answer read (1,024 adapters of long names and tenant lists fit).
pub const MAX_LIST_BYTES: usize = 4 << 20;

/// The served names the pod at `base` has registered (`GET /v1/adapters`, any state).
pub async fn list(
    http: &reqwest::Client,
    base: &str,
    token: &AdminToken,
    timeout: Duration,
) -> Result<Vec<String>, AdminError> {
    let answer = http
        .get(format!("{base}/v1/adapters"))
        .bearer_auth(&*token.0)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| transport_error(e, timeout))?;
    let status = answer.status().as_u16();
    if !(200..300).contains(&status) {
        let body = capped_text(answer).await;
        return Err(error_from_answer(status, &body));
    }
    let body = read_capped(answer, MAX_LIST_BYTES)
        .await
        .map_err(|e| AdminError {
            reason: Reason::LoadFailed,
            message: bounded(format!("listing adapters: {e}")),
        })?;
    let parsed: serde_json::Value = serde_json::from_slice(&body).map_err(|e| AdminError {
        reason: Reason::LoadFailed,
        message: bounded(format!("listing adapters: not JSON: {e}")),
    })?;
    Ok(parsed["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["name"].as_str().map(String::from))
        .collect())
}

/// Unloads served name `name` from the pod at `base` (404 `adapter_not_found` counts as done).
pub async fn unload(
    http: &reqwest::Client,
    base: &str,
    token: &AdminToken,
    name: &str,
    timeout: Duration,
) -> Result<(), AdminError> {
    let answer = http
        .delete(format!("{base}/v1/adapters/{}", path_segment(name)))
        .bearer_auth(&*token.0)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| transport_error(e, timeout))?;
    let status = answer.status().as_u16();
    if (200..300).contains(&status) {
        return Ok(());
    }
    let body = capped_text(answer).await;
    if status == 404 && parse_error(&body).0.as_deref() == Some("adapter_not_found") {
        return Ok(());
    }
    Err(error_from_answer(status, &body))
}

#[cfg(test)]
mod tests;
