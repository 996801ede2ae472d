//! The start-up adapter list (`--adapters-file`, the ConfigMap the operator mounts): every entry is
//! loaded before `/ready` turns 200, so a new or restarted pod never takes traffic without them.
//!
//! Invariants: an entry that cannot be loaded does not keep the pod unready forever — transient
//! source failures are retried a few times, then the entry is recorded as `failed` (shown by
//! `GET /v1/adapters` with its reason) and start-up goes on; a malformed file is a start-up error.

use super::registry::Registry;
use super::spec::AdapterSpec;
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

/// The file's shape: `{"adapters": [{"name", "uri", "digest", "tenants"}]}`.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct AdaptersFile {
    /// Adapters to load.
    #[serde(default)]
    pub adapters: Vec<AdapterSpec>,
}

/// Reads `path` (JSON).
pub fn read(path: &Path) -> anyhow::Result<AdaptersFile> {
    let text = std::fs::read_to_string(path)?;
    if text.trim().is_empty() {
        return Ok(AdaptersFile::default());
    }
    Ok(serde_json::from_str(&text)?)
}

/// Tries per entry when the source is unavailable.
const ATTEMPTS: u32 = 3;

/// Loads every entry of `file` into `registry`, one after another.
pub async fn load_all(registry: &Registry, file: AdaptersFile) {
    for spec in file.adapters {
        let mut attempt = 1;
        loop {
            match registry.load(spec.clone()).await {
                Ok(_) => break,
                Err(e) if e.code.as_deref() == Some("source_unavailable") && attempt < ATTEMPTS => {
                    tokio::time::sleep(Duration::from_secs(u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(e) => {
                    eprintln!(
                        "adapters: start-up adapter `{}` not loaded: {}",
                        spec.name, e.message
                    );
                    let message = format!("{}: {}", e.code.as_deref().unwrap_or("error"), e.message);
                    registry.record_failure(spec, message);
                    break;
                }
            }
        }
    }
}
