//! `modelfleet-runtime fetch`: download or copy an artifact, verify its canonical digest, and only then
//! put it in place. Used as the runtime pod's init container and by the adapter admin API.
//!
//! Flow: [`Source`] (parsed URI) → stage into a private directory ([`stage`]) → verify the canonical
//! digest of what was staged → move into DEST (and into the digest-keyed cache, when one is given).
//!
//! Invariants:
//! - DEST is left exactly as it was unless the bytes verified: staging happens beside DEST (or, when DEST
//!   is a mount point on another file system, in a hidden directory inside it that is removed on failure).
//! - A cache entry is trusted only after it is re-verified; a corrupt entry is removed and fetched again.
//! - Every failure has a [`FetchError::reason`] (a stable CamelCase word the operator turns into a
//!   condition reason) and a one-line message; secrets (tokens) never appear in either.

pub mod cache;
pub mod http;
pub mod source;
pub mod stage;

pub use source::Source;

use crate::digest::{DigestError, digest_path};
use std::path::{Path, PathBuf};

/// What to fetch and where.
#[derive(Clone, Debug)]
pub struct FetchRequest {
    /// The artifact's location.
    pub source: Source,
    /// The canonical digest its bytes must have (`sha256:<64 hex>`).
    pub digest: String,
    /// Where the verified artifact goes (a directory; a single-file artifact lands as `DEST/<name>`).
    pub dest: PathBuf,
    /// Digest-keyed cache directory, reused (after re-verification) instead of downloading again.
    pub cache: Option<PathBuf>,
    /// Hugging Face Hub endpoint for `hf://` URIs.
    pub hf_endpoint: String,
    /// Bearer token for `hf://` and `http(s)://` sources (from the environment; never logged).
    pub token: Option<String>,
}

/// How a fetch ended well.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetched {
    /// DEST already held exactly this artifact.
    AlreadyPresent,
    /// Copied from the cache after re-verification.
    FromCache,
    /// Downloaded or copied from the source and verified.
    FromSource,
}

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
            FetchError::InvalidArtifact(_) => "InvalidArtifact",
            FetchError::Io { .. } => "LocalIOError",
        }
    }

    /// The process exit code for this failure (documented in docs/operations.md).
    pub fn exit_code(&self) -> u8 {
        match self {
            FetchError::InvalidArgument(_) => 2,
            FetchError::SourceUnavailable(_) => 3,
            FetchError::DigestMismatch { .. } => 4,
            FetchError::InvalidArtifact(_) => 5,
            FetchError::Io { .. } => 6,
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

/// Verifies that `path` (a staged directory or file) has `expected` digest.
pub fn verify(path: &Path, expected: &str, uri: &str) -> Result<(), FetchError> {
    let actual = digest_path(path)?;
    if actual == expected {
        Ok(())
    } else {
        Err(FetchError::DigestMismatch {
            uri: uri.to_string(),
            expected: expected.to_string(),
            actual,
        })
    }
}

/// Fetches, verifies and places the artifact. See the module docs for the guarantees.
pub async fn fetch(req: &FetchRequest) -> Result<Fetched, FetchError> {
    validate_digest(&req.digest)?;
    if stage::dest_holds(&req.dest, &req.digest) {
        return Ok(Fetched::AlreadyPresent);
    }
    if let Some(cache) = &req.cache
        && let Some(entry) = cache::lookup(cache, &req.digest)?
    {
        stage::install_copy(&entry, &req.dest)?;
        return Ok(Fetched::FromCache);
    }
    let staging = stage::Staging::new(&req.dest)?;
    req.source.download_into(staging.path(), req).await?;
    verify(staging.path(), &req.digest, &req.source.display())?;
    if let Some(cache) = &req.cache {
        cache::store(cache, &req.digest, staging.path())?;
    }
    staging.commit(&req.dest)?;
    Ok(Fetched::FromSource)
}
