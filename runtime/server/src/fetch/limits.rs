//! How much a fetch may download and for how long: a byte budget shared by every file of one artifact
//! and a deadline for the whole fetch (`fetch --max-bytes`, `--timeout-seconds`; the adapter registry's
//! `--max-adapter-bytes`, `--adapter-fetch-timeout-seconds`).
//!
//! Invariants: the budget is checked before a transfer starts (a `Content-Length` or a local file size
//! that cannot fit fails at once) and again as bytes arrive, so a server that lies about the length or
//! streams forever is cut off at the limit; a fetch without an explicit limit is still bounded by the
//! free space of the file system it writes to (when that can be known), so it fails with a clear
//! `TooLarge` instead of filling the volume.

use super::FetchError;
use std::path::Path;
use std::time::Duration;

/// Limits of one fetch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes the artifact may have (all files together). `None`: the free space of DEST's file
    /// system, when it can be known.
    pub max_bytes: Option<u64>,
    /// Longest the whole fetch (listing, every download, verification) may take.
    pub timeout: Option<Duration>,
}

/// Free bytes (for an unprivileged writer) of the file system holding `path`, if it can be asked.
pub fn free_space(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` points at writable memory of the right type;
    // statvfs only writes into it and we read it only when it reports success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    // The field types differ between targets (32-bit on some), hence the casts.
    #[allow(clippy::unnecessary_cast)]
    let (blocks, size) = (st.f_bavail as u64, st.f_frsize as u64);
    Some(blocks.saturating_mul(size))
}

/// The bytes one artifact may still take.
#[derive(Clone, Debug)]
pub struct Budget {
    /// The limit (`None`: unlimited).
    max: Option<u64>,
    /// Bytes of files already complete.
    spent: u64,
    /// Where the limit came from, for the message (`--max-bytes`, or the free space of a path).
    origin: String,
    /// The artifact, for the message (no credentials).
    shown: String,
}

impl Budget {
    /// The budget of a fetch into `target` (an existing directory) under `limits`.
    pub fn new(limits: &Limits, target: &Path, shown: &str) -> Budget {
        let (max, origin) = match limits.max_bytes {
            Some(m) => (Some(m), "the configured limit".to_string()),
            None => (
                free_space(target),
                format!("the free space of {}", target.display()),
            ),
        };
        Budget {
            max,
            spent: 0,
            origin,
            shown: shown.to_string(),
        }
    }

    /// A budget of exactly `max` bytes (tests, and callers that know the limit).
    pub fn fixed(max: Option<u64>, shown: &str) -> Budget {
        Budget {
            max,
            spent: 0,
            origin: "the configured limit".into(),
            shown: shown.to_string(),
        }
    }

    /// Fails unless one more file of `bytes` (in total) fits.
    pub fn check(&self, bytes: u64) -> Result<(), FetchError> {
        match self.max {
            Some(max) if self.spent.saturating_add(bytes) > max => Err(FetchError::TooLarge(format!(
                "{}: {} bytes exceed {} ({max} bytes)",
                self.shown,
                self.spent.saturating_add(bytes),
                self.origin
            ))),
            _ => Ok(()),
        }
    }

    /// Records a complete file of `bytes`.
    pub fn spend(&mut self, bytes: u64) -> Result<(), FetchError> {
        self.check(bytes)?;
        self.spent += bytes;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_covers_every_file_of_an_artifact() {
        let mut b = Budget::fixed(Some(100), "hf://org/x@main");
        b.check(100).unwrap();
        b.spend(60).unwrap();
        b.check(40).unwrap();
        let e = b.check(41).unwrap_err();
        assert_eq!(e.reason(), "TooLarge");
        assert!(e.to_string().contains("101 bytes exceed"), "{e}");
        assert!(Budget::fixed(None, "x").check(u64::MAX).is_ok());
    }

    #[test]
    fn free_space_is_known_for_a_temporary_directory() {
        let t = tempfile::tempdir().unwrap();
        assert!(free_space(t.path()).is_some_and(|b| b > 0));
        assert_eq!(free_space(&t.path().join("missing")), None);
        let b = Budget::new(&Limits::default(), t.path(), "x");
        assert!(b.check(u64::MAX).is_err(), "bounded by the free space");
    }
}
