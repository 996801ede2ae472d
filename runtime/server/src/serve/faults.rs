//! Faults the admin API can inject when the server runs with `--enable-fault-injection` (tests and
//! chaos drills): the engine panicking at its next step (`POST /v1/faults/engine-panic`), and the
//! process aborting on a request that carries a marker (`POST /v1/faults/abort-on {"marker": …}`), as a
//! poison request that kills the pod would — the gateway's containment is tested against it.
//!
//! Invariants: nothing is armed unless the flag is on and the admin token checked out; an armed abort
//! fires once, in the handler right after the body was read (before validation: where a request that
//! overflows the stack while compiling would die), and writes its reason to the termination log first.

use std::sync::Mutex;

/// Longest marker accepted.
pub const MAX_MARKER_BYTES: usize = 256;

/// The armed faults.
#[derive(Default)]
pub struct Faults {
    abort_marker: Mutex<Option<Vec<u8>>>,
}

impl Faults {
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
