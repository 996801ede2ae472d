//! One logging story for the runtime: `tracing` events on stderr (plain text with `key=value` fields,
//! filtered by `RUST_LOG`, default `info`), and each finished request's usage record as one JSON line on
//! stdout (what a provider bills from).
//!
//! Invariant: writing a log line never fails its caller. `println!`/`eprintln!` panic when the pipe is
//! closed (`serve … | head` once took the engine thread down that way); here a line that cannot be
//! written is dropped — and counted, for the usage records, in `modelfleet_log_write_errors_total` — and
//! nothing panics. Log lines never carry API keys, tokens or prompt text.

use std::io::Write;

/// Installs the `tracing` subscriber (once; later calls do nothing).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        // The default reports a failed write with `eprintln!`, which panics when stderr is closed.
        .log_internal_errors(false)
        .try_init();
}

/// Writes `line` and a newline to stdout; `false` if it could not be written (closed or broken pipe).
pub fn stdout_line(line: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .is_ok()
}
