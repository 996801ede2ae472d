//! The kubelet layer's one error type.
//!
//! Errors that concern a single pod's spec (a missing Secret, an unknown image) are not errors of
//! the kubelet: they become container waiting reasons and messages in the pod's status. This type
//! covers what stops the kubelet itself or one API call: bad flags or files, I/O, the API server.

use std::path::PathBuf;

/// Everything that can fail in the kubelet outside a pod's own status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag or a configuration file is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A file or directory operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path the operation was about.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// A request to the API server failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The image map could not be parsed.
    #[error("image map {path}: {message}")]
    Images {
        /// The image map file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result with the kubelet's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
