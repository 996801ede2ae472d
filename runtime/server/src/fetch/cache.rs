//! The digest-keyed artifact cache (`fetch --cache DIR`): `DIR/sha256-<hex>/` holds a verified copy of an
//! artifact so a scale-up or a restart does not download it again.
//!
//! Invariants: an entry appears only by an atomic rename of a complete, verified copy assembled in a
//! temporary directory no other fetch uses ([`stage::unique_dir`]); an entry is re-verified before every
//! use and removed when it no longer matches (bit rot, tampering).

use super::{FetchError, stage, verify};
use std::fs;
use std::path::{Path, PathBuf};

/// An exclusive lock on one digest in the cache, held while it is fetched (an advisory `flock` on
/// `DIR/.lock-sha256-<hex>`; the kernel releases it when the holder's process ends, so a crashed
/// fetch never leaves it taken). Other fetches of the same digest on the node wait for it, then find
/// the entry: a cold start of several pods reads the source once.
pub struct Lock {
    _held: fs::File,
}

impl Lock {
    /// Waits for the lock (polling, so the caller's time limit can cancel the wait); `None` when the
    /// cache cannot hold a lock file (read-only, another owner): the fetch goes on unlocked.
    pub async fn acquire(cache: &Path, digest: &str) -> Option<Lock> {
        use std::os::fd::AsRawFd;
        fs::create_dir_all(cache).ok()?;
        let path = cache.join(format!(".lock-{}", digest.replace(':', "-")));
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .ok()?;
        let mut waited = false;
        loop {
            // SAFETY: a valid, open descriptor owned by `file`; flock neither reads nor writes memory.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Some(Lock { _held: file });
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EWOULDBLOCK) {
                return None;
            }
            if !waited {
                eprintln!("fetch: another fetch of {digest} on this node holds the cache; waiting for it");
                waited = true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

fn entry_path(cache: &Path, digest: &str) -> PathBuf {
    cache.join(digest.replace(':', "-"))
}

/// Whether the cache has an entry for `digest` (not yet verified).
pub fn has_entry(cache: &Path, digest: &str) -> bool {
    entry_path(cache, digest).is_dir()
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

/// Makes a verified staging directory inside the cache its entry for `digest`, by a rename; returns
/// the entry.
pub fn adopt(cache: &Path, digest: &str, staging: stage::Staging) -> Result<PathBuf, FetchError> {
    let entry = entry_path(cache, digest);
    if entry.is_dir() {
        return Ok(entry);
    }
    staging.adopt_as(&entry)?;
    Ok(entry)
}

/// Adds the verified tree at `verified` to the cache under `digest` (no-op if already there).
pub fn store(cache: &Path, digest: &str, verified: &Path) -> Result<(), FetchError> {
    let entry = entry_path(cache, digest);
    if entry.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(cache).map_err(FetchError::io(format!("creating {}", cache.display())))?;
    // A name of its own: fetches on one node share the cache, and every init container is PID 1.
    let tmp = stage::unique_dir(cache, ".tmp-")?;
    let result = stage::copy_tree(verified, &tmp, stage::Link::WhenPossible).and_then(|_| {
        fs::rename(&tmp, &entry).map_err(FetchError::io(format!("renaming into {}", entry.display())))
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    // Another fetch may have stored the same entry first; that is as good.
    if entry.is_dir() { Ok(()) } else { result }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storing_never_touches_another_fetchs_temporary_directory() {
        let t = tempfile::tempdir().unwrap();
        let (cache, verified) = (t.path().join("cache"), t.path().join("v"));
        fs::create_dir_all(&verified).unwrap();
        fs::write(verified.join("f"), b"bytes").unwrap();
        let digest = crate::digest::digest_path(&verified).unwrap();
        // Another init container (also PID 1, so the old `.tmp-<pid>-<len>` name) is filling this.
        fs::create_dir_all(&cache).unwrap();
        let theirs = cache.join(format!(".tmp-{}-{}", std::process::id(), digest.len()));
        fs::create_dir(&theirs).unwrap();
        fs::write(theirs.join("half"), b"in progress").unwrap();
        store(&cache, &digest, &verified).unwrap();
        assert_eq!(fs::read(theirs.join("half")).unwrap(), b"in progress");
        assert_eq!(
            lookup(&cache, &digest).unwrap(),
            Some(entry_path(&cache, &digest))
        );
        let leftovers: Vec<_> = fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with(".tmp-"))
            .collect();
        assert_eq!(leftovers.len(), 1, "only theirs is left: {leftovers:?}");
    }
}
