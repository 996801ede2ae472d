//! Operator-wide settings (flags of `modelfleet-operator run`, each also from `MODELFLEET_<FLAG>`).

use std::path::PathBuf;

/// Where runtime pods keep the digest-keyed model cache (`fetch --cache`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelCache {
    /// A host directory shared by the pods of a node (survives pod restarts and scale-ups).
    HostPath(PathBuf),
    /// A PersistentVolumeClaim (ReadWriteMany when pods land on several nodes).
    Pvc(String),
    /// No cache: every pod downloads the model.
    None,
}

/// Settings every builder reads.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// Image of `modelfleet-runtime` when a ModelDeployment does not name one.
    pub runtime_image: String,
    /// The model cache of runtime pods.
    pub model_cache: ModelCache,
    /// Seconds a runtime pod gets to drain in-flight requests on SIGTERM.
    pub termination_grace_seconds: i64,
    /// Directories under which runtime pods may read `file://` adapters (`--adapter-file-roots`). The
    /// cluster admin's choice, never a namespace user's: empty means no `file://` adapters at all.
    pub adapter_file_roots: Vec<String>,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            runtime_image: "modelfleet/runtime:latest".into(),
            model_cache: ModelCache::HostPath("/var/lib/modelfleet/cache".into()),
            termination_grace_seconds: 60,
            adapter_file_roots: Vec::new(),
        }
    }
}
