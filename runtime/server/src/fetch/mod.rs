//! `modelfleet-runtime fetch`: download or copy an artifact, verify its canonical digest, and only then
//! put it in place. Used as the runtime pod's init container and by the adapter admin API.
//!
//! Flow: [`Source`] (parsed URI; one module per scheme behind it) → with a cache, the artifact's lock
//! on the node and a re-verified cache entry if there is one → stage into a private directory
//! ([`stage`]) → verify the canonical digest of what was staged → move into DEST (and into the
//! digest-keyed cache). A mounted artifact (an image volume, a PVC) takes [`check_mounted`] instead:
//! its signature and digest, nothing written. [`Progress`] follows every phase.
//!
//! Invariants:
//! - DEST is left exactly as it was unless the bytes verified: staging happens beside DEST (or, when DEST
//!   is a mount point on another file system, in a hidden directory inside it that is removed on failure).
//! - A fetch is bounded in bytes and in time ([`limits`]): past either it fails (`TooLarge`, `TimedOut`)
//!   and its staging directory is removed.
//! - Credentials go only to the source they belong to ([`access`]): the Hub token to the Hub
//!   endpoint's origin, registry credentials to their registry; HTTP redirects only to https.
//! - A required signature is checked before anything else is downloaded (`oci://` only; any other
//!   source with a signature requirement is refused).
//! - File-system work (copies, hashing, renames) runs on the blocking pool, never on the async threads.
//! - A cache entry is trusted only after it is re-verified; a corrupt entry is removed and fetched again.
//! - Every failure has a [`FetchError::reason`] (a stable CamelCase word the operator turns into a
//!   condition reason) and a one-line message; secrets (tokens) never appear in either.

pub mod access;
pub mod cache;
pub mod download;
pub mod error;
pub mod limits;
pub mod progress;
pub mod progress_http;
pub mod source;
pub mod stage;

pub use access::Access;
pub use error::{FetchError, validate_digest};
pub use limits::Limits;
pub use progress::{Phase, Progress};
pub use source::Source;

use crate::digest::digest_path;
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
    /// Byte and time limits.
    pub limits: Limits,
    /// Endpoints, trust and credentials of the sources (secrets redacted from `Debug`).
    pub access: Access,
    /// The key a signature of the artifact must verify with (`oci://` sources; `None`: no signature
    /// is required).
    pub signature_key: Option<source::oci::signature::PublicKey>,
    /// Where the fetch reports how far it has come.
    pub progress: Progress,
}

impl FetchRequest {
    /// A request with no cache, no limits, default access and fresh progress counters.
    pub fn new(source: Source, digest: impl Into<String>, dest: impl Into<PathBuf>) -> FetchRequest {
        FetchRequest {
            source,
            digest: digest.into(),
            dest: dest.into(),
            cache: None,
            limits: Limits::default(),
            access: Access::default(),
            signature_key: None,
            progress: Progress::default(),
        }
    }
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
pub(crate) async fn blocking<T: Send + 'static>(
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
    if let Source::Pvc(_) = &req.source {
        return Err(FetchError::InvalidArgument(format!(
            "{}: a pvc:// model is mounted, not copied: check it with --mounted DIR",
            req.source.display()
        )));
    }
    let bounded = async {
        let (dest, digest) = (req.dest.clone(), req.digest.clone());
        if blocking(move || Ok(stage::dest_holds(&dest, &digest))).await? {
            return Ok::<_, FetchError>(Fetched::AlreadyPresent);
        }
        if let Some(how) = from_cache(req).await? {
            return Ok(how);
        }
        // One download per artifact and node at a time: the others wait, then find it in the cache
        // (entries appear by rename, so the unlocked look above never sees half of one).
        let lock = match &req.cache {
            Some(cache) => cache::Lock::acquire(cache, &req.digest).await,
            None => None,
        };
        if lock.is_some()
            && let Some(how) = from_cache(req).await?
        {
            return Ok(how);
        }
        let staging = download_verified(req).await?;
        place(req, staging).await?;
        Ok(Fetched::FromSource)
    };
    let how = match req.limits.timeout {
        None => bounded.await?,
        Some(limit) => tokio::time::timeout(limit, bounded).await.map_err(|_| {
            FetchError::TimedOut(format!(
                "{}: not downloaded and verified within {} s (the time limit)",
                req.source.display(),
                limit.as_secs_f64()
            ))
        })??,
    };
    req.progress.enter(Phase::Done);
    Ok(how)
}

/// Installs a verified cache entry into DEST, if the cache has one.
async fn from_cache(req: &FetchRequest) -> Result<Option<Fetched>, FetchError> {
    let Some(cache) = req.cache.clone() else {
        return Ok(None);
    };
    let (dest, digest, progress) = (req.dest.clone(), req.digest.clone(), req.progress.clone());
    blocking(move || {
        if !cache::has_entry(&cache, &digest) {
            return Ok(None);
        }
        progress.enter(Phase::Verify);
        let Some(entry) = cache::lookup(&cache, &digest)? else {
            return Ok(None);
        };
        progress.enter(Phase::Install);
        stage::install_copy(&entry, &dest)?;
        Ok(Some(Fetched::FromCache))
    })
    .await
}

/// Puts a verified staging directory into DEST (and the cache). Local work, never half done. Staged in
/// the cache, it becomes the cache entry by a rename and DEST gets a copy (a hard link where the two
/// share a mount); staged beside DEST, it is committed there and copied into the cache, which is an
/// optimisation: a cache that cannot be written (read-only, another owner) does not fail the fetch.
async fn place(req: &FetchRequest, staging: stage::Staging) -> Result<(), FetchError> {
    let (dest, digest, cache) = (req.dest.clone(), req.digest.clone(), req.cache.clone());
    req.progress.enter(Phase::Install);
    blocking(move || match &cache {
        Some(cache) if staging.path().parent() == Some(cache.as_path()) => {
            let entry = cache::adopt(cache, &digest, staging)?;
            stage::install_copy(&entry, &dest)
        }
        _ => {
            if let Some(cache) = &cache
                && let Err(e) = cache::store(cache, &digest, staging.path())
            {
                eprintln!("fetch: not cached in {}: {e}", cache.display());
            }
            staging.commit(&dest)
        }
    })
    .await
}

/// Checks an artifact that is mounted rather than fetched (an image volume, a PVC): its signature
/// (`oci://`, when a key is configured) and the canonical digest of `mounted`. Writes nothing.
pub async fn check_mounted(req: &FetchRequest, mounted: &Path) -> Result<(), FetchError> {
    validate_digest(&req.digest)?;
    match (&req.source, &req.signature_key) {
        (Source::Oci(r), Some(_)) => source::oci::check_signature(r, req).await?,
        (_, Some(_)) => {
            return Err(FetchError::InvalidArgument(format!(
                "{}: signatures are checked for oci:// artifacts only",
                req.source.display()
            )));
        }
        (_, None) => {}
    }
    req.progress.enter(Phase::Verify);
    let (path, digest, shown) = (mounted.to_path_buf(), req.digest.clone(), req.source.display());
    blocking(move || verify(&path, &digest, &shown)).await?;
    req.progress.enter(Phase::Done);
    Ok(())
}

/// Downloads into a new staging directory within the byte budget and verifies it. Dropping the
/// future (the time limit) or failing removes the staging directory.
async fn download_verified(req: &FetchRequest) -> Result<stage::Staging, FetchError> {
    let (dest, cache) = (req.dest.clone(), req.cache.clone());
    // With a node cache, bytes land in it (where partial downloads resume and the entry is made by a
    // rename); without one, or when it cannot be written, beside DEST.
    let staging = blocking(
        move || match cache.as_deref().and_then(|c| stage::Staging::new_in(c).ok()) {
            Some(s) => Ok(s),
            None => stage::Staging::new(&dest),
        },
    )
    .await?;
    let mut budget = limits::Budget::new(
        &req.limits,
        staging.path().parent().unwrap_or(staging.path()),
        &req.source.display(),
    );
    if req.signature_key.is_some() && !matches!(req.source, Source::Oci(_)) {
        return Err(FetchError::InvalidArgument(format!(
            "{}: signatures are checked for oci:// artifacts only",
            req.source.display()
        )));
    }
    req.source.download_into(staging.path(), req, &mut budget).await?;
    req.progress.enter(Phase::Verify);
    let (digest, shown) = (req.digest.clone(), req.source.display());
    blocking(move || {
        verify(staging.path(), &digest, &shown)?;
        Ok(staging)
    })
    .await
}
