//! Termination messages: what `state.terminated.message` says after a container exits.
//!
//! The termination-message file (at most 4096 bytes) wins; when it is empty, the policy is
//! `FallbackToLogsOnError` and the exit code is non-zero, the tail of the container's log is used:
//! the last 80 lines within the last 2048 bytes, as the kubelet does.
//!
//! Invariants: the choice is a pure function of the two byte strings; only [`read`] touches files;
//! the fallback only sees output of the run that just ended (the log is appended across restarts).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Bytes of the termination-message file that are read.
pub const MAX_MESSAGE_BYTES: u64 = 4096;
/// Bytes of log considered for the fallback.
pub const MAX_LOG_BYTES: u64 = 2048;
/// Lines of log kept for the fallback.
pub const MAX_LOG_LINES: usize = 80;

/// Chooses the message from the file contents and (lazily) the log tail.
pub fn choose(
    file: &[u8],
    log_tail: impl FnOnce() -> Vec<u8>,
    fallback_to_logs: bool,
    exit_code: i32,
) -> Option<String> {
    if !file.is_empty() {
        let end = file.len().min(MAX_MESSAGE_BYTES as usize);
        return Some(String::from_utf8_lossy(&file[..end]).into_owned());
    }
    if !fallback_to_logs || exit_code == 0 {
        return None;
    }
    let tail = log_tail();
    let text = String::from_utf8_lossy(&tail);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let kept = lines[lines.len().saturating_sub(MAX_LOG_LINES)..].concat();
    (!kept.is_empty()).then_some(kept)
}

/// Reads the message of an exited container whose output starts at byte `log_start` of `log`
/// (the log file is shared by all runs of the container).
pub fn read(
    termination_log: &Path,
    log: &Path,
    log_start: u64,
    fallback_to_logs: bool,
    exit_code: i32,
) -> Option<String> {
    let mut file = Vec::new();
    if let Ok(f) = std::fs::File::open(termination_log) {
        let _ = f.take(MAX_MESSAGE_BYTES).read_to_end(&mut file);
    }
    choose(
        &file,
        || tail(log, log_start, MAX_LOG_BYTES),
        fallback_to_logs,
        exit_code,
    )
}

fn tail(path: &Path, start: u64, max: u64) -> Vec<u8> {
    let mut out = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if f.seek(SeekFrom::Start(len.saturating_sub(max).max(start)))
            .is_ok()
        {
            let _ = f.take(max).read_to_end(&mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(file: &str, log: &str, fallback: bool, code: i32, expected: Option<&str>) {
        let got = choose(file.as_bytes(), || log.as_bytes().to_vec(), fallback, code);
        assert_eq!(
            got.as_deref(),
            expected,
            "file {file:?} fallback {fallback} code {code}"
        );
    }

    #[test]
    fn message_comes_from_file_then_logs_on_error() {
        check("digest ok", "log", true, 1, Some("digest ok"));
        check("digest ok", "log", false, 0, Some("digest ok"));
        check("", "boom\n", true, 1, Some("boom\n"));
        check("", "boom\n", true, 0, None);
        check("", "boom\n", false, 1, None);
        check("", "", true, 1, None);
        let many: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let last80: String = (20..100).map(|i| format!("line {i}\n")).collect();
        check("", &many, true, 2, Some(&last80));
        let big = "x".repeat(5000);
        let got = choose(big.as_bytes(), Vec::new, false, 0).unwrap();
        assert_eq!(got.len(), 4096);
    }

    #[test]
    fn reading_files_limits_sizes() {
        let tmp = tempfile::tempdir().unwrap();
        let (msg, log) = (tmp.path().join("msg"), tmp.path().join("log"));
        std::fs::write(&msg, "").unwrap();
        let text: String = (0..1000).map(|i| format!("{i:04}\n")).collect();
        std::fs::write(&log, &text).unwrap();
        let got = read(&msg, &log, 0, true, 1).unwrap();
        assert!(got.len() <= 2048);
        assert!(got.ends_with("0999\n"));
        assert_eq!(got.lines().count(), 80);
        let start = text.len() as u64 - 10;
        assert_eq!(read(&msg, &log, start, true, 1).as_deref(), Some("0998\n0999\n"));
        assert_eq!(read(&msg, &log, text.len() as u64, true, 1), None);
        std::fs::write(&msg, "done").unwrap();
        assert_eq!(read(&msg, &log, 0, true, 1).as_deref(), Some("done"));
        let none = tmp.path().join("none");
        assert_eq!(read(&none, &none, 0, true, 1), None);
    }
}
