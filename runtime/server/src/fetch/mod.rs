//! `modelfleet-runtime fetch`: download or copy an artifact, verify its canonical digest, and only then
//! put it in place. Used as the runtime pod's init container and by the adapter admin API.
//!
//! Flow: [`Source`] (parsed URI) → stage into a private directory ([`stage`]) → verify the canonical
//! digest of what was staged → move into DEST (and into the digest-keyed cache, when one is given).
//!
//! Invariants:
//! - DEST is left exactly as it was unless the bytes verified: staging happens beside DEST (or, when DEST
//!   is a mount point on another file system, in a hidden directory inside it that is removed on failure).
//! - A fetch is bounded in bytes and in time ([`limits`]): past either it fails (`TooLarge`, `TimedOut`)
//!   and its staging directory is removed.
//! - Credentials go only to the Hugging Face endpoint's origin, redirects only to https ([`http`]).
//! - File-system work (copies, hashing, renames) runs on the blocking pool, never on the async threads.
//! - A cache entry is trusted only after it is re-verified; a corrupt entry is removed and fetched again.
//! - Every failure has a [`FetchError::reason`] (a stable CamelCase word the operator turns into a
//!   condition reason) and a one-line message; secrets (tokens) never appear in either.

pub mod cache;
pub mod http;
pub mod limits;
pub mod source;
pub mod stage;

pub use limits::Limits;
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
    /// Bearer token (from the environment; never logged), sent only to `hf_endpoint`'s origin.
    pub token: Option<String>,
    /// Byte and time limits.
    pub limits: Limits,
    /// PEM certificates trusted for https besides the system's roots (a private mirror's CA).
    pub ca_file: Option<PathBuf>,
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
            FetchError::InvalidArtifact(_) => "InvalidArtifact",
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
            FetchError::InvalidArtifact(_) => 5,
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

/// Runs file-system work on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FetchError> + Send + 'static,
) -> Result<T, FetchError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| FetchError::Io {
        context: "file-system task".into(),
        source: std::io::Error::other(e.to_string()),
    })?
}

/// Fetches, verifies and places the artifact; the download and its verification are bounded by
/// `req.limits`. See the module docs for the guarantees.
pub async fn fetch(req: &FetchRequest) -> Result<Fetched, FetchError> {
    validate_digest(&req.digest)?;
    let (dest, digest, cache) = (req.dest.clone(), req.digest.clone(), req.cache.clone());
    let found = blocking(move || {
        if stage::dest_holds(&dest, &digest) {
            return Ok(Some(Fetched::AlreadyPresent));
        }
        if let Some(cache) = &cache
            && let Some(entry) = cache::lookup(cache, &digest)?
        {
            stage::install_copy(&entry, &dest)?;
            return Ok(Some(Fetched::FromCache));
        }
        Ok(None)
    })
    .await?;
    if let Some(how) = found {
        return Ok(how);
    }
    let staging = match req.limits.timeout {
        None => download_verified(req).await?,
        Some(limit) => tokio::time::timeout(limit, download_verified(req))
            .await
            .map_err(|_| {
                FetchError::TimedOut(format!(
                    "{}: not downloaded and verified within {} s (the time limit)",
                    req.source.display(),
                    limit.as_secs_f64()
                ))
            })??,
    };
    // Verified: placing it is local work, outside the time limit (never half done). The cache is an
    // optimisation: a cache that cannot be written (read-only, another owner) does not fail the fetch.
    let (dest, digest, cache) = (req.dest.clone(), req.digest.clone(), req.cache.clone());
    blocking(move || {
        if let Some(cache) = &cache
            && let Err(e) = cache::store(cache, &digest, staging.path())
        {
            eprintln!("fetch: not cached in {}: {e}", cache.display());
        }
        staging.commit(&dest)
    })
    .await?;
    Ok(Fetched::FromSource)
}

/// Downloads into a new staging directory within the byte budget and verifies it. Dropping the
/// future (the time limit) or failing removes the staging directory.
async fn download_verified(req: &FetchRequest) -> Result<stage::Staging, FetchError> {
    let dest = req.dest.clone();
    let staging = blocking(move || stage::Staging::new(&dest)).await?;
    let mut budget = limits::Budget::new(
        &req.limits,
        staging.path().parent().unwrap_or(staging.path()),
        &req.source.display(),
    );
    req.source.download_into(staging.path(), req, &mut budget).await?;
    let (digest, shown) = (req.digest.clone(), req.source.display());
    blocking(move || {
        verify(staging.path(), &digest, &shown)?;
        Ok(staging)
    })
    .await
}
