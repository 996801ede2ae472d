//! Staging directories: where an artifact is assembled before it is verified, and how it is moved into
//! DEST afterwards.
//!
//! Invariants: DEST is not modified before [`Staging::commit`]; a staging directory that is dropped
//! without a commit is removed. Staging sits beside DEST (same file system, so commit is a rename), except
//! when DEST is a mount point (a Kubernetes volume), where it is a hidden directory inside DEST. Every
//! staging or temporary directory has a name no other fetch can hold ([`unique_dir`]: created with
//! `mkdir`, which fails rather than share, under a name drawn from the clock, a counter and the OS's
//! random source) — init containers are all PID 1, so a PID names nothing — and a fetch only ever
//! removes directories it created itself.

use super::FetchError;
use crate::digest::digest_path;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Name prefix of staging directories placed inside DEST.
const INNER_PREFIX: &str = ".modelfleet-staging-";

/// A private directory that becomes DEST's content on commit, or disappears.
pub struct Staging {
    path: PathBuf,
    committed: bool,
}

impl Staging {
    /// Creates a fresh, empty staging directory for `dest`.
    pub fn new(dest: &Path) -> Result<Staging, FetchError> {
        let name = dest
            .file_name()
            .ok_or_else(|| FetchError::InvalidArgument(format!("--dest {} has no name", dest.display())))?
            .to_string_lossy()
            .into_owned();
        let parent = dest.parent().unwrap_or(Path::new("/"));
        let path = if is_mount_point(dest, parent) {
            unique_dir(dest, INNER_PREFIX)?
        } else {
            fs::create_dir_all(parent).map_err(FetchError::io(format!("creating {}", parent.display())))?;
            unique_dir(parent, &format!(".{name}.staging-"))?
        };
        Ok(Staging {
            path,
            committed: false,
        })
    }

    /// A fresh, empty staging directory inside `dir` (the node cache), for an artifact that becomes a
    /// cache entry by [`Staging::adopt_as`].
    pub fn new_in(dir: &Path) -> Result<Staging, FetchError> {
        fs::create_dir_all(dir).map_err(FetchError::io(format!("creating {}", dir.display())))?;
        Ok(Staging {
            path: unique_dir(dir, ".staging-")?,
            committed: false,
        })
    }

    /// Renames the staging directory to `to` (on the same file system); a `to` that appeared meanwhile
    /// (another fetch stored the same artifact) is kept and this staging directory removed.
    pub fn adopt_as(mut self, to: &Path) -> Result<(), FetchError> {
        match fs::rename(&self.path, to) {
            Ok(()) => {
                self.committed = true;
                Ok(())
            }
            Err(_) if to.is_dir() => Ok(()),
            Err(e) => Err(FetchError::io(format!("renaming into {}", to.display()))(e)),
        }
    }

    /// The staging directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the staged files DEST's whole content (replacing what DEST held).
    pub fn commit(mut self, dest: &Path) -> Result<(), FetchError> {
        let io = |what: &Path| FetchError::io(format!("installing into {}", what.display()));
        if self.path.parent() == Some(dest) {
            clear_dir(dest, Some(&self.path))?;
            for entry in fs::read_dir(&self.path).map_err(io(&self.path))? {
                let entry = entry.map_err(io(&self.path))?;
                fs::rename(entry.path(), dest.join(entry.file_name())).map_err(io(dest))?;
            }
            fs::remove_dir(&self.path).map_err(io(&self.path))?;
        } else {
            if dest.exists() {
                fs::remove_dir_all(dest).map_err(io(dest))?;
            }
            fs::rename(&self.path, dest).map_err(io(dest))?;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Creates a new directory `parent/<prefix><unique>` and returns its path. The name mixes the clock,
/// a per-process counter and 64 random bits; `mkdir` refuses an existing name, so two fetches (in one
/// process or in two containers that are both PID 1) never share a directory.
pub fn unique_dir(parent: &Path, prefix: &str) -> Result<PathBuf, FetchError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    for _ in 0..16 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let random: u64 = rand::random();
        let path = parent.join(format!("{prefix}{nanos:x}-{n}-{random:016x}"));
        match fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(FetchError::io(format!("creating {}", path.display()))(e)),
        }
    }
    Err(FetchError::io(format!(
        "creating a directory in {}",
        parent.display()
    ))(std::io::Error::other("no unused name after 16 tries")))
}

/// True when `dest` exists as a directory on another device than its parent (a mount point).
fn is_mount_point(dest: &Path, parent: &Path) -> bool {
    match (fs::metadata(dest), fs::metadata(parent)) {
        (Ok(d), Ok(p)) => d.is_dir() && d.dev() != p.dev(),
        _ => false,
    }
}

/// Removes every entry of `dir` except `keep`.
fn clear_dir(dir: &Path, keep: Option<&Path>) -> Result<(), FetchError> {
    let io = FetchError::io(format!("clearing {}", dir.display()));
    let entries = fs::read_dir(dir).map_err(io)?;
    for entry in entries.flatten() {
        let path = entry.path();
        if Some(path.as_path()) == keep {
            continue;
        }
        let result = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        result.map_err(FetchError::io(format!("removing {}", path.display())))?;
    }
    Ok(())
}

/// True when `dest` already holds exactly the artifact with `digest` (ignoring our own staging leftovers).
pub fn dest_holds(dest: &Path, digest: &str) -> bool {
    let non_empty = fs::read_dir(dest).is_ok_and(|mut d| d.next().is_some());
    non_empty && digest_path(dest).is_ok_and(|d| d == digest)
}

/// Whether [`copy_tree`] may hard-link files instead of copying them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Between trees this fetch owns (staging, the cache): a link shares bytes that were verified.
    WhenPossible,
    /// From a source: a link would let the source's owner change bytes after they were verified.
    Never,
}

/// Copies the tree under `from` into `to` (an existing directory); returns the bytes of the files.
/// Symlinks and special files are refused, never followed.
pub fn copy_tree(from: &Path, to: &Path, link: Link) -> Result<u64, FetchError> {
    let mut bytes = 0;
    for entry in fs::read_dir(from).map_err(FetchError::io(format!("reading {}", from.display())))? {
        let entry = entry.map_err(FetchError::io(format!("reading {}", from.display())))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let ft = entry
            .file_type()
            .map_err(FetchError::io(src.display().to_string()))?;
        if ft.is_dir() {
            fs::create_dir(&dst).map_err(FetchError::io(format!("creating {}", dst.display())))?;
            bytes += copy_tree(&src, &dst, link)?;
        } else if ft.is_file() {
            let linked = link == Link::WhenPossible && fs::hard_link(&src, &dst).is_ok();
            bytes += if linked {
                fs::metadata(&dst)
                    .map_err(FetchError::io(dst.display().to_string()))?
                    .len()
            } else {
                fs::copy(&src, &dst).map_err(FetchError::io(format!("copying {}", src.display())))?
            };
        } else {
            return Err(FetchError::InvalidArtifact(crate::digest::DigestError::Symlink(
                src,
            )));
        }
    }
    Ok(bytes)
}

/// Total bytes of the regular files under `dir` (symlinks and special files are not counted; the
/// copy refuses them).
pub fn tree_size(dir: &Path) -> Result<u64, FetchError> {
    let mut bytes = 0;
    for entry in fs::read_dir(dir).map_err(FetchError::io(format!("reading {}", dir.display())))? {
        let entry = entry.map_err(FetchError::io(format!("reading {}", dir.display())))?;
        let meta =
            fs::symlink_metadata(entry.path()).map_err(FetchError::io(entry.path().display().to_string()))?;
        if meta.is_dir() {
            bytes += tree_size(&entry.path())?;
        } else if meta.is_file() {
            bytes += meta.len();
        }
    }
    Ok(bytes)
}

/// Installs a verified tree (a cache entry) into `dest` through a staging copy.
pub fn install_copy(verified: &Path, dest: &Path) -> Result<(), FetchError> {
    let staging = Staging::new(dest)?;
    copy_tree(verified, staging.path(), Link::WhenPossible)?;
    staging.commit(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_directories_are_distinct_and_removed_unless_committed() {
        let t = tempfile::tempdir().unwrap();
        let dest = t.path().join("model");
        let (a, b) = (Staging::new(&dest).unwrap(), Staging::new(&dest).unwrap());
        assert_ne!(a.path(), b.path());
        let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
        fs::write(pb.join("f"), b"x").unwrap();
        drop(a);
        assert!(
            !pa.exists() && pb.join("f").exists(),
            "dropping one leaves the other alone"
        );
        b.commit(&dest).unwrap();
        assert_eq!(fs::read(dest.join("f")).unwrap(), b"x");
    }

    #[test]
    fn copies_from_a_source_never_share_its_inodes() {
        let t = tempfile::tempdir().unwrap();
        let (src, a, b) = (t.path().join("src"), t.path().join("a"), t.path().join("b"));
        for d in [&src, &a, &b] {
            fs::create_dir(d).unwrap();
        }
        fs::write(src.join("w"), b"0123").unwrap();
        assert_eq!(copy_tree(&src, &a, Link::Never).unwrap(), 4);
        assert_eq!(copy_tree(&src, &b, Link::WhenPossible).unwrap(), 4);
        // Rewritten in place: the private copy keeps the bytes that were there; a link follows.
        fs::OpenOptions::new()
            .write(true)
            .open(src.join("w"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"9999"))
            .unwrap();
        assert_eq!(fs::read(a.join("w")).unwrap(), b"0123");
        assert_eq!(fs::read(b.join("w")).unwrap(), b"9999");
        assert_eq!(tree_size(&src).unwrap(), 4);
    }
}
