//! `file:///path`: a local file or directory (in a pod, one of the node file roots the operator mounts
//! read-only), copied into staging.
//!
//! Invariants: the copy never follows symlinks and never hard-links: the staged bytes are a private
//! copy, so what is verified is what is later read, whatever happens to the source afterwards.

use super::super::limits::Budget;
use super::super::stage::{self, Link};
use super::super::{FetchError, progress::Progress};
use std::fs;
use std::path::{Path, PathBuf};

/// Parses what follows `file://`: an absolute path.
pub fn parse(path: &str, invalid: impl Fn(&str) -> FetchError) -> Result<PathBuf, FetchError> {
    if !path.starts_with('/') {
        return Err(invalid("file:// URIs need an absolute path (file:///dir/model)"));
    }
    Ok(PathBuf::from(path))
}

/// Copies a local file (as `staging/<name>`) or directory tree (its contents) into `staging`.
pub fn copy_into(
    from: &Path,
    staging: &Path,
    budget: &mut Budget,
    progress: &Progress,
) -> Result<(), FetchError> {
    let meta = fs::symlink_metadata(from)
        .map_err(|e| FetchError::SourceUnavailable(format!("file://{}: {e}", from.display())))?;
    if meta.is_file() {
        let name = from.file_name().ok_or_else(|| {
            FetchError::InvalidArgument(format!("file://{} has no file name", from.display()))
        })?;
        budget.check(meta.len())?;
        progress.expect(meta.len());
        let copied = fs::copy(from, staging.join(name))
            .map_err(FetchError::io(format!("copying {}", from.display())))?;
        progress.add(copied);
        budget.spend(copied)
    } else if meta.is_dir() {
        let size = stage::tree_size(from)?;
        budget.check(size)?;
        progress.expect(size);
        let copied = stage::copy_tree(from, staging, Link::Never)?;
        progress.add(copied);
        budget.spend(copied)
    } else {
        Err(FetchError::SourceUnavailable(format!(
            "file://{} is not a regular file or directory (symlinks are refused)",
            from.display()
        )))
    }
}
