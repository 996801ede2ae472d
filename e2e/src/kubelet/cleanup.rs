//! Start-up cleanup of a previous kubelet's leftovers in the state directory.
//!
//! A kubelet that crashed (or was SIGKILLed) leaves pod directories and possibly processes. Before
//! any pod starts, every `pods/*/containers/*/pid` that still names a live process-group leader
//! gets that group SIGKILLed, logs are kept under `logs/`, and the pod directories are removed;
//! pods still bound to this node are then started afresh by their workers.
//!
//! Invariant: only process groups recorded by this kubelet's own pid files are signalled.

use std::path::Path;

use super::pod::kill_leftover;

/// Cleans `<state_dir>/pods`.
pub fn stale_pods(state_dir: &Path) {
    let pods = state_dir.join("pods");
    let Ok(entries) = std::fs::read_dir(&pods) else {
        return;
    };
    for pod in entries.flatten() {
        let pod_dir = pod.path();
        for container in std::fs::read_dir(pod_dir.join("containers"))
            .into_iter()
            .flatten()
            .flatten()
        {
            kill_leftover(&container.path().join("pid"));
        }
        for log in std::fs::read_dir(pod_dir.join("logs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let (Some(pod_name), Some(file)) = (
                pod.file_name().to_str().map(str::to_string),
                log.file_name().to_str().map(str::to_string),
            ) else {
                continue;
            };
            // <ns>_<name>_<uid> → keep as <ns>_<name>_<container>.log
            let prefix = pod_name
                .rsplit_once('_')
                .map_or(pod_name.as_str(), |(p, _)| p)
                .to_string();
            let kept = state_dir.join("logs").join(format!("{prefix}_{file}"));
            let _ = std::fs::create_dir_all(state_dir.join("logs"));
            let _ = std::fs::copy(log.path(), kept);
        }
        tracing::info!(dir = %pod_dir.display(), "removing a pod directory left by a previous kubelet");
        let _ = std::fs::remove_dir_all(&pod_dir);
    }
}
