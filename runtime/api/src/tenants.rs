//! Tenancy: API keys → tenant ids, from the tenants file (the mounted Secret), reloaded when it changes so
//! keys rotate without a restart.
//!
//! ```yaml
//! tenants:
//! - id: team-a
//!   apiKeys: ["sk-team-a-1"]          # and/or apiKeySha256: ["<hex of sha256(key)>"]
//!   maxConcurrentRequests: 64          # optional quotas
//!   maxQueuedTokens: 200000
//!   requestsPerMinute: 600             # fleet-wide limits, enforced by the gateway
//!   tokensPerMinute: 200000            # (crate::limits)
//!   budget: {daily: "25.00", monthly: "400"}
//! ```
//!
//! Invariants: keys are held only as SHA-256 digests and never logged or echoed in errors; a presented key
//! is hashed and the match is confirmed with a constant-time comparison; a key belongs to one tenant only; a
//! file that fails to parse on reload leaves the previous keys in force (and says why in the log); the
//! tenant id — never anything in a request body — is what scopes the prefix cache and quotas.

use crate::limits::{BudgetEntry, Limits};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The tenant of single-tenant mode (no tenants file).
pub const DEFAULT_TENANT: &str = "default";

/// One tenant's identity and quotas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// The id (a metric label and the prefix-cache scope).
    pub id: String,
    /// Most requests in flight (queued + running) at once; None = unlimited.
    pub max_concurrent_requests: Option<u32>,
    /// Most prompt tokens queued at once; None = unlimited.
    pub max_queued_tokens: Option<u64>,
    /// Request, token and spend limits over the whole fleet (the gateway's).
    pub limits: Limits,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TenantEntry {
    id: String,
    #[serde(default)]
    api_keys: Vec<String>,
    #[serde(default)]
    api_key_sha256: Vec<String>,
    #[serde(default)]
    max_concurrent_requests: Option<u32>,
    #[serde(default)]
    max_queued_tokens: Option<u64>,
    #[serde(default)]
    requests_per_minute: Option<u64>,
    #[serde(default)]
    tokens_per_minute: Option<u64>,
    #[serde(default)]
    budget: Option<BudgetEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    tenants: Vec<TenantEntry>,
}

/// Why a tenants file was refused. Messages name the tenant and field, never a key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TenantsError {
    /// The file could not be read.
    #[error("{path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
    /// The file is not valid YAML/JSON of the expected shape.
    #[error("tenants file: {0}")]
    Parse(String),
    /// A semantic problem (duplicate ids or keys, bad id, bad digest, no keys).
    #[error("tenants file: {0}")]
    Invalid(String),
}

/// An immutable snapshot of the key table.
#[derive(Debug, Default)]
pub struct Tenants {
    by_digest: HashMap<[u8; 32], Arc<Tenant>>,
    tenants: Vec<Arc<Tenant>>,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn digest_of(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn parse_hex_digest(hex_digest: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(hex_digest.trim().to_ascii_lowercase()).ok()?;
    bytes.try_into().ok()
}

/// The first line of a parser message with every quoted value elided: parsers quote the offending value
/// and show source snippets, and either may be a key.
fn redact(message: &str) -> String {
    let first = message.lines().next().unwrap_or_default();
    let mut out = String::new();
    let mut in_quotes = false;
    for c in first.chars() {
        match (c, in_quotes) {
            ('"', false) => {
                in_quotes = true;
                out.push_str("\"…");
            }
            ('"', true) => {
                in_quotes = false;
                out.push('"');
            }
            (_, false) => out.push(c),
            (_, true) => {}
        }
    }
    out
}

/// Constant-time equality of two digests (also the admin token's check).
pub fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tenants {
    /// Parses a tenants file (YAML, of which JSON is a subset).
    pub fn parse(text: &str) -> Result<Tenants, TenantsError> {
        let file: TenantsFile =
            serde_saphyr::from_str(text).map_err(|e| TenantsError::Parse(redact(&e.to_string())))?;
        let mut out = Tenants::default();
        let mut ids = std::collections::HashSet::new();
        for (i, entry) in file.tenants.into_iter().enumerate() {
            if !valid_id(&entry.id) {
                return Err(TenantsError::Invalid(format!(
                    "tenants[{i}].id {:?} must be 1-63 characters of letters, digits, '-', '_' or '.'",
                    entry.id
                )));
            }
            if !ids.insert(entry.id.clone()) {
                return Err(TenantsError::Invalid(format!(
                    "tenants[{i}].id {:?} appears twice",
                    entry.id
                )));
            }
            if entry.api_keys.is_empty() && entry.api_key_sha256.is_empty() {
                return Err(TenantsError::Invalid(format!(
                    "tenant {:?} has no apiKeys or apiKeySha256",
                    entry.id
                )));
            }
            let limits = crate::limits::from_entry(
                &entry.id,
                entry.requests_per_minute,
                entry.tokens_per_minute,
                entry.budget.as_ref(),
            )
            .map_err(TenantsError::Invalid)?;
            let tenant = Arc::new(Tenant {
                id: entry.id.clone(),
                max_concurrent_requests: entry.max_concurrent_requests,
                max_queued_tokens: entry.max_queued_tokens,
                limits,
            });
            let mut digests = Vec::new();
            for (k, key) in entry.api_keys.iter().enumerate() {
                if key.len() < 8 {
                    return Err(TenantsError::Invalid(format!(
                        "tenant {:?}: apiKeys[{k}] is shorter than 8 characters",
                        entry.id
                    )));
                }
                digests.push(digest_of(key));
            }
            for (k, hex_digest) in entry.api_key_sha256.iter().enumerate() {
                digests.push(parse_hex_digest(hex_digest).ok_or_else(|| {
                    TenantsError::Invalid(format!(
                        "tenant {:?}: apiKeySha256[{k}] must be 64 hex digits",
                        entry.id
                    ))
                })?);
            }
            for d in digests {
                if let Some(other) = out.by_digest.insert(d, tenant.clone()) {
                    return Err(TenantsError::Invalid(format!(
                        "tenant {:?} reuses a key of tenant {:?}",
                        entry.id, other.id
                    )));
                }
            }
            out.tenants.push(tenant);
        }
        Ok(out)
    }

    /// The tenant whose key this is, if any.
    pub fn authenticate(&self, presented: &str) -> Option<Arc<Tenant>> {
        let d = digest_of(presented);
        let (stored, tenant) = self.by_digest.get_key_value(&d)?;
        ct_eq(stored, &d).then(|| tenant.clone())
    }

    /// Every tenant, in file order.
    pub fn all(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }
}

/// How requests are authenticated: one tenant for everyone, or keys from a file that may change.
#[derive(Clone)]
pub enum Auth {
    /// No tenants file: every request is tenant "default"; no key is required.
    SingleTenant(Arc<Tenant>),
    /// Keys from a file, swapped in place on reload.
    Keys(Arc<RwLock<Arc<Tenants>>>),
}

/// The outcome of authenticating a request.
#[derive(Debug, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A key that belongs to nobody.
    Invalid,
}

impl Auth {
    /// Single-tenant mode.
    pub fn single_tenant() -> Auth {
        Auth::SingleTenant(Arc::new(Tenant {
            id: DEFAULT_TENANT.into(),
            max_concurrent_requests: None,
            max_queued_tokens: None,
            limits: Limits::default(),
        }))
    }

    /// Authenticates the value of an `Authorization` header.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Arc<Tenant>, AuthError> {
        match self {
            Auth::SingleTenant(t) => Ok(t.clone()),
            Auth::Keys(table) => {
                let key = bearer_token(authorization).ok_or(AuthError::Missing)?;
                let snapshot = table.read().unwrap().clone();
                snapshot.authenticate(key).ok_or(AuthError::Invalid)
            }
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header value, if there is a non-empty one.
pub fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    authorization
        .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// Loads the tenants file and returns the shared table.
pub fn load(path: &Path) -> Result<Arc<RwLock<Arc<Tenants>>>, TenantsError> {
    let text = std::fs::read_to_string(path).map_err(|e| TenantsError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    Ok(Arc::new(RwLock::new(Arc::new(Tenants::parse(&text)?))))
}

/// Polls the file every `every` and swaps in a new table when its content changes and parses. Kubernetes
/// updates a mounted Secret by swapping a symlink, so the content (not the mtime) is compared.
pub fn spawn_reloader(
    path: PathBuf,
    table: Arc<RwLock<Arc<Tenants>>>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    // The baseline is what `load` saw (read before the task starts, so no change can slip in between).
    let mut last = std::fs::read(&path).ok().map(|b| Sha256::digest(&b));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Ok(bytes) = tokio::fs::read(&path).await else {
                continue;
            };
            let digest = Sha256::digest(&bytes);
            if last.as_ref() == Some(&digest) {
                continue;
            }
            last = Some(digest);
            match std::str::from_utf8(&bytes)
                .map_err(|e| TenantsError::Parse(e.to_string()))
                .and_then(Tenants::parse)
            {
                Ok(new) => {
                    tracing::info!(
                        file = %path.display(),
                        tenants = new.all().len(),
                        "tenants file reloaded"
                    );
                    *table.write().unwrap() = Arc::new(new);
                }
                Err(e) => tracing::warn!(
                    file = %path.display(),
                    error = %e,
                    "tenants file invalid; keeping the previous keys"
                ),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
tenants:
- id: team-a
  apiKeys: ["sk-team-a-1", "sk-team-a-2"]
  maxConcurrentRequests: 64
  maxQueuedTokens: 200000
  requestsPerMinute: 600
  tokensPerMinute: 200000
  budget: {daily: "25.50", monthly: 400}
- id: team-b
  apiKeySha256: ["3c6fbb7e2a2bc5e5a7e7f2e9e4c0e46e3f48f3ec4e1cf6b2f9e0d9b6c6d7a8b9"]
"#;

    #[test]
    fn limits_are_read_and_checked() {
        let t = Tenants::parse(FILE).unwrap();
        let a = &t.all()[0].limits;
        assert_eq!(
            (
                a.requests_per_minute,
                a.tokens_per_minute,
                a.daily_budget_micros,
                a.monthly_budget_micros
            ),
            (Some(600), Some(200_000), Some(25_500_000), Some(400_000_000))
        );
        assert!(!t.all()[1].limits.any());
        let bad = "tenants:\n- id: x\n  apiKeys: [sk-xxxxxxxx]\n  budget: {daily: \"1.1234567\"}\n";
        let e = Tenants::parse(bad).unwrap_err().to_string();
        assert!(
            e.contains("tenant \"x\": budget.daily must be a positive amount"),
            "{e}"
        );
        let bad = "tenants:\n- id: x\n  apiKeys: [sk-xxxxxxxx]\n  budget: {weekly: 3}\n";
        assert!(Tenants::parse(bad).is_err());
    }

    #[test]
    fn keys_map_to_tenants() {
        let t = Tenants::parse(FILE).unwrap();
        let a = t.authenticate("sk-team-a-2").unwrap();
        assert_eq!(
            (a.id.as_str(), a.max_concurrent_requests, a.max_queued_tokens),
            ("team-a", Some(64), Some(200000))
        );
        assert!(t.authenticate("sk-team-a-3").is_none());
        assert!(t.authenticate("").is_none());
        let hashed = hex::encode(Sha256::digest(b"sk-hashed-key"));
        let t = Tenants::parse(&format!(
            "tenants:\n- id: h\n  apiKeySha256: [\"{}\"]\n",
            hashed.to_uppercase()
        ))
        .unwrap();
        assert_eq!(t.authenticate("sk-hashed-key").unwrap().id, "h");
    }

    #[test]
    fn json_works_too() {
        let t = Tenants::parse(r#"{"tenants": [{"id": "j", "apiKeys": ["sk-json-key"]}]}"#).unwrap();
        assert_eq!(t.authenticate("sk-json-key").unwrap().id, "j");
    }

    fn check_refused(text: &str, fragment: &str) {
        let err = Tenants::parse(text).unwrap_err().to_string();
        assert!(err.contains(fragment), "{err:?} lacks {fragment:?}");
        assert!(!err.contains("sk-secret"), "a key leaked into {err:?}");
    }

    #[test]
    fn bad_files_are_refused_without_leaking_keys() {
        check_refused(
            "tenants:\n- id: a\n  apiKeys: [sk-secret-1]\n- id: b\n  apiKeys: [sk-secret-1]\n",
            "reuses a key of tenant \"a\"",
        );
        check_refused(
            "tenants:\n- id: a\n  apiKeys: [sk-secret-1]\n- id: a\n  apiKeys: [sk-secret-2]\n",
            "appears twice",
        );
        check_refused(
            "tenants:\n- id: 'a b'\n  apiKeys: [sk-secret-1]\n",
            "tenants[0].id",
        );
        check_refused("tenants:\n- id: a\n", "has no apiKeys");
        check_refused(
            "tenants:\n- id: a\n  apiKeys: [short]\n",
            "apiKeys[0] is shorter than 8",
        );
        check_refused(
            "tenants:\n- id: a\n  apiKeySha256: [xyz]\n",
            "apiKeySha256[0] must be 64 hex",
        );
        check_refused(
            "tenants:\n- id: a\n  apiKeys: [sk-secret-1]\n  maxQueuedToken: 5\n",
            "unknown field `maxQueuedToken`",
        );
        check_refused("tenants:\n- id: a\n  apiKeys: sk-secret-1\n", "line 3");
        check_refused(
            "tenants:\n- id: a\n  apiKeys: [sk-secret-1]\n  maxQueuedTokens: sk-secret-2\n",
            "line 4",
        );
    }

    #[test]
    fn bearer_header_handling() {
        let auth = Auth::Keys(Arc::new(RwLock::new(Arc::new(Tenants::parse(FILE).unwrap()))));
        assert_eq!(
            auth.authenticate(Some("Bearer sk-team-a-1")).unwrap().id,
            "team-a"
        );
        assert_eq!(auth.authenticate(None), Err(AuthError::Missing));
        assert_eq!(auth.authenticate(Some("Basic abc")), Err(AuthError::Missing));
        assert_eq!(auth.authenticate(Some("Bearer ")), Err(AuthError::Missing));
        assert_eq!(
            auth.authenticate(Some("Bearer sk-nobody-1")),
            Err(AuthError::Invalid)
        );
        assert_eq!(
            Auth::single_tenant().authenticate(None).unwrap().id,
            DEFAULT_TENANT
        );
    }

    #[tokio::test]
    async fn rotation_swaps_keys_and_a_broken_file_keeps_the_old_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.yaml");
        std::fs::write(&path, "tenants:\n- id: a\n  apiKeys: [sk-old-key-1]\n").unwrap();
        let table = load(&path).unwrap();
        let auth = Auth::Keys(table.clone());
        let task = spawn_reloader(path.clone(), table, Duration::from_millis(20));
        assert!(auth.authenticate(Some("Bearer sk-old-key-1")).is_ok());

        std::fs::write(&path, "tenants:\n- id: a\n  apiKeys: [sk-new-key-1]\n").unwrap();
        for _ in 0..100 {
            if auth.authenticate(Some("Bearer sk-new-key-1")).is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(auth.authenticate(Some("Bearer sk-new-key-1")).is_ok());
        assert_eq!(
            auth.authenticate(Some("Bearer sk-old-key-1")),
            Err(AuthError::Invalid)
        );

        std::fs::write(&path, "tenants: [ this is not valid").unwrap();
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(
            auth.authenticate(Some("Bearer sk-new-key-1")).is_ok(),
            "a broken file must not drop keys"
        );
        task.abort();
    }
}
