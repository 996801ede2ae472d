//! Why a fetch failed: [`FetchError`], with a stable reason word and exit code per kind (what the
//! operator turns into a condition), and the digest form every fetch checks first.
//!
//! Invariants: a message never holds a secret (tokens, keys, URL credentials); the reason words and
//! exit codes are a contract with the operator and docs/operations.md — add, never renumber.

use crate::digest::DigestError;

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URI or digest is malformed or uses an unsupported scheme.
    #[error("{0}")]
    InvalidArgument(String),
    /// The source could not be reached or does not have the artifact.
    #[error("{0}")]
    SourceUnavailable(String),
    /// The bytes do not match the declared digest.
    #[error("digest mismatch for {uri}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// The source URI (without credentials).
        uri: String,
        /// The declared digest.
        expected: String,
        /// What the fetched bytes hash to.
        actual: String,
    },
    /// The artifact holds something a digest cannot describe (symlinks, special files).
    #[error("{0}")]
    InvalidArtifact(DigestError),
    /// The artifact is not of a kind or form this runtime reads (an OCI artifact of another type, a
    /// layer that would write outside the model, a missing file path).
    #[error("{0}")]
    Malformed(String),
    /// The source refused the credentials (or there were none and it wants some).
    #[error("{0}")]
    Unauthorized(String),
    /// A signature is required and none verifies: `reason` is `SignatureNotFound`,
    /// `SignatureInvalid` (no signature verifies with the key) or `SignatureDigestMismatch` (a valid
    /// signature of another manifest).
    #[error("{message}")]
    Signature {
        /// The condition reason word.
        reason: &'static str,
        /// What was found, without secrets.
        message: String,
    },
    /// The artifact is larger than the byte limit (or than the space left for it).
    #[error("{0}")]
    TooLarge(String),
    /// The fetch did not finish within its time limit.
    #[error("{0}")]
    TimedOut(String),
    /// Local file-system trouble (DEST, cache or staging).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl FetchError {
    /// A stable reason word for termination messages and conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            FetchError::InvalidArgument(_) => "InvalidArgument",
            FetchError::SourceUnavailable(_) => "SourceUnavailable",
            FetchError::DigestMismatch { .. } => "DigestMismatch",
            FetchError::InvalidArtifact(_) | FetchError::Malformed(_) => "InvalidArtifact",
            FetchError::Unauthorized(_) => "Unauthorized",
            FetchError::Signature { reason, .. } => reason,
            FetchError::Io { .. } => "LocalIOError",
            FetchError::TooLarge(_) => "TooLarge",
            FetchError::TimedOut(_) => "TimedOut",
        }
    }

    /// The process exit code for this failure (documented in docs/operations.md).
    pub fn exit_code(&self) -> u8 {
        match self {
            FetchError::InvalidArgument(_) => 2,
            FetchError::SourceUnavailable(_) => 3,
            FetchError::DigestMismatch { .. } => 4,
            FetchError::InvalidArtifact(_) | FetchError::Malformed(_) => 5,
            FetchError::Signature { .. } => 9,
            FetchError::Unauthorized(_) => 10,
            FetchError::Io { .. } => 6,
            FetchError::TooLarge(_) => 7,
            FetchError::TimedOut(_) => 8,
        }
    }

    /// One line: `<Reason>: <message>` (what the operator reads from the termination message).
    pub fn termination_message(&self) -> String {
        format!("{}: {}", self.reason(), self).replace('\n', " ")
    }

    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> FetchError {
        let context = context.into();
        move |source| FetchError::Io { context, source }
    }
}

impl From<DigestError> for FetchError {
    fn from(e: DigestError) -> Self {
        match e {
            DigestError::Io { path, source } => FetchError::Io {
                context: path.display().to_string(),
                source,
            },
            other => FetchError::InvalidArtifact(other),
        }
    }
}

/// Checks the `sha256:<64 lower-case hex>` form.
pub fn validate_digest(digest: &str) -> Result<(), FetchError> {
    let ok = digest.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(FetchError::InvalidArgument(format!(
            "--digest must be sha256: followed by 64 lower-case hex digits, got {digest:?}"
        )))
    }
}
