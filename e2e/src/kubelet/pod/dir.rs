//! The layout of a pod's directory on the host.
//!
//! ```text
//! <state-dir>/pods/<namespace>_<name>_<uid>/
//!   kubeconfig, token                 the pod's API credentials (KUBECONFIG points here)
//!   volumes/<volume>/                 emptyDir, secret, configMap, projected, downwardAPI
//!   containers/<container>/           termination-log, pid (process group of the running process)
//!   logs/<container>.log              stdout and stderr, appended across restarts
//! <state-dir>/logs/<namespace>_<name>_<container>.log   copies kept after the pod is gone
//! ```
//!
//! Invariant: every path of a pod is below its root, whose name contains the pod's UID, so two
//! pods never share files even when a name is reused.

use std::path::{Path, PathBuf};

/// Paths of one pod.
#[derive(Debug, Clone)]
pub struct PodDir {
    root: PathBuf,
    kept_logs: PathBuf,
    namespace: String,
    name: String,
}

impl PodDir {
    /// The directory of pod `namespace/name` with `uid` under `state_dir`.
    pub fn new(state_dir: &Path, namespace: &str, name: &str, uid: &str) -> Self {
        PodDir {
            root: state_dir.join("pods").join(format!("{namespace}_{name}_{uid}")),
            kept_logs: state_dir.join("logs"),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The pod's root directory (also `HOME` and the default working directory).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Host directory backing a non-hostPath volume.
    pub fn volume(&self, volume: &str) -> PathBuf {
        self.root.join("volumes").join(volume)
    }

    /// Per-container directory.
    pub fn container(&self, container: &str) -> PathBuf {
        self.root.join("containers").join(container)
    }

    /// Host file standing in for the container's `terminationMessagePath`.
    pub fn termination_log(&self, container: &str) -> PathBuf {
        self.container(container).join("termination-log")
    }

    /// File recording the process group id of the container's running process.
    pub fn pid_file(&self, container: &str) -> PathBuf {
        self.container(container).join("pid")
    }

    /// The container's log (stdout and stderr).
    pub fn log(&self, container: &str) -> PathBuf {
        self.root.join("logs").join(format!("{container}.log"))
    }

    /// Where the container's log is kept after the pod directory is removed.
    pub fn kept_log(&self, container: &str) -> PathBuf {
        self.kept_logs
            .join(format!("{}_{}_{container}.log", self.namespace, self.name))
    }

    /// The pod's kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.root.join("kubeconfig")
    }

    /// The token file the kubeconfig reads.
    pub fn token(&self) -> PathBuf {
        self.root.join("token")
    }
}
