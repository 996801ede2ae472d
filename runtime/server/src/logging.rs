//! One logging story for the runtime: `tracing` events on stderr (plain text with `key=value` fields or
//! JSON, filtered by `RUST_LOG`, default `info`; installed by `modelfleet_telemetry::init`), and each
//! finished request's usage record as one JSON line on stdout (what a provider bills from).
//!
//! Invariant: writing a log line never fails its caller. `println!`/`eprintln!` panic when the pipe is
//! closed (`serve … | head` once took the engine thread down that way); here a line that cannot be
//! written is dropped — and counted, for the usage records, in `modelfleet_log_write_errors_total` — and
//! nothing panics. Log lines never carry API keys, tokens or prompt text.

use std::io::Write;

/// Writes `line` and a newline to stdout; `false` if it could not be written (closed or broken pipe).
pub fn stdout_line(line: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .is_ok()
}
