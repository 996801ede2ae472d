//! The start-up adapter list (`--adapters-file`, the ConfigMap the operator mounts): its entries load
//! side by side (at most `--startup-adapter-concurrency` at once) while the server already answers
//! `/health`; `/ready` waits until each entry is loaded or given up on, and never longer than
//! `--startup-adapter-deadline-seconds`.
//!
//! Invariants: one slow or broken source cannot keep the pod unready — an entry is given up on (for
//! readiness) when it loaded, failed for good (digest, compatibility, policy), failed [`ATTEMPTS`]
//! times for a reason a retry may fix (`source_unavailable`, `source_timeout`, `load_in_progress`), or
//! when the deadline passed; it is then listed as `failed` by `GET /v1/adapters` (with why) and, if the
//! reason may pass, retried in the background (back-off from 1 s to 60 s) until it loads, or until the
//! admin API unloads or replaces that name. A malformed file is a start-up error.

use super::registry::Registry;
use super::spec::AdapterSpec;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

pub use crate::api::adapters::AdaptersFile;

/// Reads `path` (JSON; empty: no adapters).
pub fn read(path: &Path) -> anyhow::Result<AdaptersFile> {
    Ok(AdaptersFile::parse(&std::fs::read_to_string(path)?)?)
}

/// How the list is loaded (serve flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartupPolicy {
    /// Entries loading at once (`--startup-adapter-concurrency`).
    pub concurrency: usize,
    /// Longest `/ready` waits for the list (`--startup-adapter-deadline-seconds`).
    pub deadline: Duration,
}

impl Default for StartupPolicy {
    fn default() -> Self {
        StartupPolicy {
            concurrency: 4,
            deadline: Duration::from_secs(120),
        }
    }
}

/// Tries of an entry before it is given up on for readiness (it keeps being retried in the background).
pub const ATTEMPTS: u32 = 3;
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Error codes a later try may not get.
fn transient(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("source_unavailable" | "source_timeout" | "load_in_progress")
    )
}

fn backoff(failures: u32) -> Duration {
    (FIRST_RETRY * 2u32.saturating_pow(failures.saturating_sub(1).min(16))).min(MAX_RETRY)
}

/// Loads every entry of `file` into `registry` (see the module docs); returns when `/ready` may turn
/// 200. Entries still loading then go on in the background.
pub async fn load_all(registry: Arc<Registry>, file: AdaptersFile, policy: StartupPolicy) {
    let permits = Arc::new(Semaphore::new(policy.concurrency.max(1)));
    let specs = file.adapters;
    let tasks: Vec<_> = specs
        .iter()
        .map(|spec| tokio::spawn(settle(registry.clone(), spec.clone(), permits.clone())))
        .collect();
    if tokio::time::timeout(policy.deadline, futures::future::join_all(tasks))
        .await
        .is_err()
    {
        // The tasks go on (dropping a JoinHandle detaches it); readiness no longer waits for them.
        for spec in specs {
            let message = format!(
                "start_up_deadline: not loaded within {} s of start-up; still loading in the background",
                policy.deadline.as_secs_f64()
            );
            if registry.fail_if_pending(&spec, message) {
                tracing::warn!(
                    adapter = %spec.name,
                    "start-up adapter not loaded by the deadline; /ready no longer waits for it"
                );
            }
        }
    }
}

/// One try under the concurrency limit; `Err((code, message))` on failure.
async fn try_load(
    registry: &Registry,
    spec: &AdapterSpec,
    permits: &Semaphore,
) -> Result<(), (Option<String>, String)> {
    let _permit = permits.acquire().await.expect("the semaphore is never closed");
    registry
        .load(spec.clone())
        .await
        .map(|_| ())
        .map_err(|e| (e.code.clone(), e.message))
}

/// Loads `spec` until it is settled for readiness; hands a retryable failure to [`retry`].
async fn settle(registry: Arc<Registry>, spec: AdapterSpec, permits: Arc<Semaphore>) {
    for attempt in 1..=ATTEMPTS {
        let (code, message) = match try_load(&registry, &spec, &permits).await {
            Ok(()) => return,
            Err(e) => e,
        };
        let shown = format!("{}: {message}", code.as_deref().unwrap_or("error"));
        if !transient(code.as_deref()) {
            tracing::warn!(adapter = %spec.name, error = %message, "start-up adapter not loaded");
            registry.record_failure(spec, shown);
            return;
        }
        if attempt == ATTEMPTS {
            tracing::warn!(
                adapter = %spec.name,
                error = %message,
                "start-up adapter not loaded after {ATTEMPTS} tries; retrying in the background"
            );
            registry.record_failure(spec.clone(), format!("{shown} (retrying in the background)"));
            tokio::spawn(retry(registry, spec, permits, attempt));
            return;
        }
        tokio::time::sleep(backoff(attempt)).await;
    }
}

/// Background retries of an entry given up on, while the admin API has not unloaded or replaced it.
async fn retry(registry: Arc<Registry>, spec: AdapterSpec, permits: Arc<Semaphore>, mut failures: u32) {
    loop {
        tokio::time::sleep(backoff(failures)).await;
        if !registry.retry_wanted(&spec) {
            return;
        }
        match try_load(&registry, &spec, &permits).await {
            Ok(()) => {
                tracing::info!(adapter = %spec.name, "start-up adapter loaded after {failures} failed tries");
                return;
            }
            Err((code, message)) => {
                failures += 1;
                let shown = format!("{}: {message}", code.as_deref().unwrap_or("error"));
                if !transient(code.as_deref()) {
                    registry.record_failure(spec, shown);
                    return;
                }
                if !registry.retry_wanted(&spec) {
                    return;
                }
                registry.record_failure(spec.clone(), format!("{shown} (retrying in the background)"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_minute() {
        let got: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert!(transient(Some("source_timeout")) && !transient(Some("digest_mismatch")));
    }
}
