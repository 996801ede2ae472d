//! Container processes: start one in its own process group, observe its exit, signal its group.
//!
//! Invariants: every container process leads a new process group (`setsid`-like via
//! `process_group(0)`), so signals reach whatever it forks; once the leader exits the kubelet
//! SIGKILLs the rest of the group, as a container runtime tears down the container's cgroup; the
//! group id is written to a pid file while it runs, so a restarted kubelet can kill leftovers.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use k8s_openapi::jiff::Timestamp;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Everything needed to start a container's process.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// Executable.
    pub program: PathBuf,
    /// Arguments.
    pub args: Vec<String>,
    /// The complete environment.
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: PathBuf,
    /// Directories to create before starting (subPath mounts, working dir under the pod).
    pub create_dirs: Vec<PathBuf>,
    /// Log file (stdout and stderr, appended).
    pub log: PathBuf,
    /// Termination-message file, truncated before each start.
    pub termination_log: PathBuf,
    /// Pid file of the running process group.
    pub pid_file: PathBuf,
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ExitInfo {
    /// Exit code, or 128 + signal when killed by a signal.
    pub code: i32,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// When the exit was observed.
    pub at: Timestamp,
}

/// Starts the process; `on_exit` runs once when it has exited (after its group was killed).
/// Returns the pid, which is also the process group id.
pub fn spawn(spec: &LaunchSpec, on_exit: impl FnOnce(ExitInfo) + Send + 'static) -> std::io::Result<u32> {
    for dir in &spec.create_dirs {
        std::fs::create_dir_all(dir)?;
    }
    for file in [&spec.log, &spec.termination_log, &spec.pid_file] {
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
    }
    std::fs::write(&spec.termination_log, b"")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)?;
    let mut command = tokio::process::Command::new(&spec.program);
    command
        .args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .process_group(0)
        .kill_on_drop(false);
    let mut child = command.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("process exited before its pid was read"))?;
    let _ = std::fs::write(&spec.pid_file, pid.to_string());
    let pid_file = spec.pid_file.clone();
    tokio::spawn(async move {
        let status = child.wait().await;
        signal_group(pid, Signal::SIGKILL);
        let _ = std::fs::remove_file(&pid_file);
        on_exit(exit_info(status));
    });
    Ok(pid)
}

fn exit_info(status: std::io::Result<std::process::ExitStatus>) -> ExitInfo {
    use std::os::unix::process::ExitStatusExt;
    let at = now();
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => ExitInfo {
                code,
                signal: None,
                at,
            },
            (None, Some(sig)) => ExitInfo {
                code: 128 + sig,
                signal: Some(sig),
                at,
            },
            (None, None) => ExitInfo {
                code: 255,
                signal: None,
                at,
            },
        },
        Err(_) => ExitInfo {
            code: 255,
            signal: None,
            at,
        },
    }
}

/// Sends `signal` to process group `pgid`; a group that is already gone is not an error.
pub fn signal_group(pgid: u32, signal: Signal) {
    if let Ok(pgid) = i32::try_from(pgid)
        && pgid > 1
    {
        let _ = killpg(Pid::from_raw(pgid), signal);
    }
}

/// Kills the process group recorded in a pid file left by a previous kubelet, if that process
/// still leads its group.
pub fn kill_leftover(pid_file: &Path) {
    let Some(pid) = std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    else {
        return;
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command: state, ppid, pgrp, …
    let pgrp = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(2));
    if pgrp == Some(pid.to_string().as_str()) {
        tracing::info!(pid, file = %pid_file.display(), "killing a process group left by a previous kubelet");
        signal_group(pid, Signal::SIGKILL);
    }
}

/// Now, truncated to whole seconds (the API stores seconds; equal values compare equal).
pub fn now() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}
