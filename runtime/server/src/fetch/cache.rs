//! The digest-keyed artifact cache (`fetch --cache DIR`): `DIR/sha256-<hex>/` holds a verified copy of an
//! artifact so a scale-up or a restart does not download it again.
//!
//! Invariants: an entry appears only by an atomic rename of a complete, verified copy; an entry is
//! re-verified before every use and removed when it no longer matches (bit rot, tampering).

use super::{FetchError, stage, verify};
use std::fs;
use std::path::{Path, PathBuf};

fn entry_path(cache: &Path, digest: &str) -> PathBuf {
    cache.join(digest.replace(':', "-"))
}

/// The verified cache entry for `digest`, if there is one. A corrupt entry is removed.
pub fn lookup(cache: &Path, digest: &str) -> Result<Option<PathBuf>, FetchError> {
    let entry = entry_path(cache, digest);
    if !entry.is_dir() {
        return Ok(None);
    }
    match verify(&entry, digest, &format!("cache entry {}", entry.display())) {
        Ok(()) => Ok(Some(entry)),
        Err(FetchError::DigestMismatch { actual, .. }) => {
            eprintln!(
                "fetch: cache entry {} hashes to {actual}; removing it",
                entry.display()
            );
            fs::remove_dir_all(&entry).map_err(FetchError::io(format!("removing {}", entry.display())))?;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Adds the verified tree at `verified` to the cache under `digest` (no-op if already there).
pub fn store(cache: &Path, digest: &str, verified: &Path) -> Result<(), FetchError> {
    let entry = entry_path(cache, digest);
    if entry.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(cache).map_err(FetchError::io(format!("creating {}", cache.display())))?;
    let tmp = cache.join(format!(".tmp-{}-{}", std::process::id(), digest.len()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir(&tmp).map_err(FetchError::io(format!("creating {}", tmp.display())))?;
    let result = stage::copy_tree(verified, &tmp).and_then(|()| {
        fs::rename(&tmp, &entry).map_err(FetchError::io(format!("renaming into {}", entry.display())))
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    // Another fetch may have stored the same entry first; that is as good.
    if entry.is_dir() { Ok(()) } else { result }
}
