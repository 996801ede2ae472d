//! Staging directories: where an artifact is assembled before it is verified, and how it is moved into
//! DEST afterwards.
//!
//! Invariants: DEST is not modified before [`Staging::commit`]; a staging directory that is dropped
//! without a commit is removed. Staging sits beside DEST (same file system, so commit is a rename), except
//! when DEST is a mount point (a Kubernetes volume), where it is a hidden directory inside DEST.

use super::FetchError;
use crate::digest::digest_path;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
        let unique = format!("{}-{}", std::process::id(), nanos());
        let path = if is_mount_point(dest, parent) {
            dest.join(format!("{INNER_PREFIX}{unique}"))
        } else {
            fs::create_dir_all(parent).map_err(FetchError::io(format!("creating {}", parent.display())))?;
            parent.join(format!(".{name}.staging-{unique}"))
        };
        fs::create_dir(&path).map_err(FetchError::io(format!("creating {}", path.display())))?;
        Ok(Staging {
            path,
            committed: false,
        })
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

fn nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
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

/// Copies the tree under `from` into `to` (an existing directory), hard-linking files when possible.
/// Symlinks and special files are refused, never followed.
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), FetchError> {
    for entry in fs::read_dir(from).map_err(FetchError::io(format!("reading {}", from.display())))? {
        let entry = entry.map_err(FetchError::io(format!("reading {}", from.display())))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let ft = entry
            .file_type()
            .map_err(FetchError::io(src.display().to_string()))?;
        if ft.is_dir() {
            fs::create_dir(&dst).map_err(FetchError::io(format!("creating {}", dst.display())))?;
            copy_tree(&src, &dst)?;
        } else if ft.is_file() {
            if fs::hard_link(&src, &dst).is_err() {
                fs::copy(&src, &dst).map_err(FetchError::io(format!("copying {}", src.display())))?;
            }
        } else {
            return Err(FetchError::InvalidArtifact(crate::digest::DigestError::Symlink(
                src,
            )));
        }
    }
    Ok(())
}

/// Installs a verified tree (a cache entry) into `dest` through a staging copy.
pub fn install_copy(verified: &Path, dest: &Path) -> Result<(), FetchError> {
    let staging = Staging::new(dest)?;
    copy_tree(verified, staging.path())?;
    staging.commit(dest)
}
