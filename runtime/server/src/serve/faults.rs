//! Faults the admin API can inject when the server runs with `--enable-fault-injection` (tests and
//! chaos drills): the engine panicking at its next step (`POST /v1/faults/engine-panic`), and the
//! process aborting on a request that carries a marker (`POST /v1/faults/abort-on {"marker": …}`), as a
//! poison request that kills the pod would — the gateway's containment is tested against it.
//!
//! Two standing faults make a bad revision for canary drills, set by flags that need
//! `--enable-fault-injection`: `--fault-error-percent` answers that share of generation requests with
//! a 500 (every ⌊100/p⌋-th, spread evenly), `--fault-delay-ms` holds each one before it is scheduled.
//!
//! Invariants: nothing is armed unless the flag is on and the admin token checked out; an armed abort
//! fires once, in the handler right after the body was read (before validation: where a request that
//! overflows the stack while compiling would die), and writes its reason to the termination log first.

use modelfleet_api::error::{ApiError, ApiErrorKind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Longest marker accepted.
pub const MAX_MARKER_BYTES: usize = 256;

/// The armed faults.
#[derive(Default)]
pub struct Faults {
    abort_marker: Mutex<Option<Vec<u8>>>,
    error_percent: u64,
    delay: Duration,
    seen: AtomicU64,
}

impl Faults {
    /// The standing faults (both zero: none).
    pub fn new(error_percent: u32, delay: Duration) -> Self {
        Faults {
            error_percent: u64::from(error_percent.min(100)),
            delay,
            ..Default::default()
        }
    }

    /// Holds the request `--fault-delay-ms` from its `arrival`, then fails it if it falls in
    /// `--fault-error-percent`. A first-token deadline (`first_token_by`) that passes during the hold
    /// ends it there, as the engine would.
    pub async fn degrade(&self, arrival: Instant, first_token_by: Option<Instant>) -> Result<(), ApiError> {
        if !self.delay.is_zero() {
            let until = arrival + self.delay;
            match first_token_by {
                Some(by) if by <= until => {
                    tokio::time::sleep_until(by.into()).await;
                    let ms = by.saturating_duration_since(arrival).as_millis();
                    return Err(modelfleet_api::deadline::passed(format!(
                        "no first token within the first-token deadline ({ms} ms after arrival)"
                    )));
                }
                _ => tokio::time::sleep_until(until.into()).await,
            }
        }
        if self.error_percent == 0 {
            return Ok(());
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        // Request n fails when the running count of failures due steps up at it.
        if (n + 1) * self.error_percent / 100 > n * self.error_percent / 100 {
            return Err(ApiError::new(
                ApiErrorKind::Internal,
                "injected fault (--fault-error-percent)",
            ));
        }
        Ok(())
    }

    /// Arms an abort on the next request whose body contains `marker`.
    pub fn arm_abort(&self, marker: &str) {
        *self.lock() = Some(marker.as_bytes().to_vec());
    }

    /// Aborts the process if an abort is armed and `body` carries its marker.
    pub fn check(&self, body: &[u8], termination_log: Option<&std::path::Path>) {
        let fire = self
            .lock()
            .as_ref()
            .is_some_and(|m| body.windows(m.len()).any(|w| w == m.as_slice()));
        if fire {
            let line = "fault injection: aborted on a request carrying the armed marker";
            tracing::error!("{line}");
            crate::fetch_cmd::write_termination_log(termination_log, line);
            std::process::abort();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<u8>>> {
        self.abort_marker.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_error_share_is_exact_and_spread() {
        let f = Faults::new(20, Duration::ZERO);
        let mut failed = vec![];
        for i in 0..100 {
            if f.degrade(Instant::now(), None).await.is_err() {
                failed.push(i);
            }
        }
        assert_eq!(
            failed,
            [
                4, 9, 14, 19, 24, 29, 34, 39, 44, 49, 54, 59, 64, 69, 74, 79, 84, 89, 94, 99
            ]
        );
        assert!(Faults::default().degrade(Instant::now(), None).await.is_ok());
    }

    #[tokio::test]
    async fn a_first_token_deadline_cuts_the_hold_short() {
        let f = Faults::new(0, Duration::from_millis(5_000));
        let t0 = Instant::now();
        let e = f
            .degrade(t0, Some(t0 + Duration::from_millis(30)))
            .await
            .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(e.code.as_deref(), Some(modelfleet_api::deadline::CODE));
        let f = Faults::new(0, Duration::from_millis(20));
        assert!(f.degrade(t0, Some(t0 + Duration::from_secs(60))).await.is_ok());
    }
}
