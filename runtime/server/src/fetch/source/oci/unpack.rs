//! Tar layers unpacked into the staging directory, as safely as the digest demands: what comes out is
//! plain files and directories under the target, nothing else.
//!
//! Invariants: an entry's path is normalised (`./` and a leading `/` dropped) and must then be a safe
//! relative path, or the layer is refused; only entries under the chosen prefix are written (a model
//! image's `models/`), everything else is skipped unread; symlinks, devices and FIFOs under the
//! prefix are refused (a digest never describes them), a hard link is written as a copy of a file
//! this layer or an earlier one wrote; modes are not carried (files 0644, directories 0755); an OCI
//! whiteout removes what an earlier layer wrote, an opaque whiteout empties its directory of earlier
//! layers' entries; every byte written is charged to the budget.

use super::super::super::FetchError;
use super::super::super::limits::Budget;
use std::fs;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

/// How a layer blob is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
}

impl Compression {
    /// From a media type's suffix (`+gzip`, `.gzip`, `+zstd`, `.zstd`; anything else is plain).
    pub fn of(media_type: &str) -> Compression {
        if media_type.ends_with("gzip") {
            Compression::Gzip
        } else if media_type.ends_with("zstd") {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// Opens a layer blob for reading its tar stream.
fn open(blob: &Path, compression: Compression) -> Result<Box<dyn Read>, FetchError> {
    let file = fs::File::open(blob).map_err(FetchError::io(format!("opening {}", blob.display())))?;
    let reader = io::BufReader::with_capacity(1 << 20, file);
    Ok(match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(reader)),
        Compression::Zstd => Box::new(
            ruzstd::decoding::StreamingDecoder::new(reader)
                .map_err(|e| FetchError::Malformed(format!("{}: not zstd: {e}", blob.display())))?,
        ),
    })
}

/// Where a layer's entries go.
pub struct Target<'a> {
    /// The directory entries are written into.
    pub root: &'a Path,
    /// Only entries under this prefix (relative, e.g. `models`) are written, with it stripped; empty:
    /// every entry.
    pub prefix: &'a Path,
    /// Whether `.wh.` entries are OCI whiteouts (image layers) or names like any other (ModelPack).
    pub whiteouts: bool,
}

/// A normalised entry path, or `None` if it is unsafe (`..`, empty).
fn normalise(raw: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// The entry's path relative to the target's prefix, if it is under it.
fn under_prefix(target: &Target, path: &Path) -> Option<PathBuf> {
    if target.prefix.as_os_str().is_empty() {
        return Some(path.to_path_buf());
    }
    let rest = path.strip_prefix(target.prefix).ok()?;
    (!rest.as_os_str().is_empty()).then(|| rest.to_path_buf())
}

fn malformed(blob: &Path, why: String) -> FetchError {
    FetchError::Malformed(format!(
        "layer {}: {why}",
        blob.file_name().unwrap_or_default().to_string_lossy()
    ))
}

/// Applies one layer blob to the target: whiteouts first (an image layer's), then its entries.
pub fn apply(
    blob: &Path,
    compression: Compression,
    target: &Target,
    budget: &mut Budget,
) -> Result<(), FetchError> {
    if target.whiteouts {
        apply_whiteouts(blob, compression, target)?;
    }
    let mut archive = tar::Archive::new(open(blob, compression)?);
    let entries = archive
        .entries()
        .map_err(|e| malformed(blob, format!("not a tar: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| malformed(blob, format!("bad tar entry: {e}")))?;
        let raw = entry
            .path()
            .map_err(|e| malformed(blob, format!("bad entry path: {e}")))?
            .into_owned();
        let path =
            normalise(&raw).ok_or_else(|| malformed(blob, format!("unsafe path {}", raw.display())))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if target.whiteouts && name.starts_with(".wh.") {
            continue;
        }
        let Some(rel) = under_prefix(target, &path) else {
            continue;
        };
        write_entry(&mut entry, &rel, target, blob, budget)?;
    }
    Ok(())
}

/// Writes one entry (already known to be under the prefix) at `root/rel`.
fn write_entry(
    entry: &mut tar::Entry<'_, Box<dyn Read>>,
    rel: &Path,
    target: &Target,
    blob: &Path,
    budget: &mut Budget,
) -> Result<(), FetchError> {
    let root = target.root;
    let dest = root.join(rel);
    let io = |what: &str| FetchError::io(format!("{what} {}", dest.display()));
    use tar::EntryType as T;
    match entry.header().entry_type() {
        T::Directory => fs::create_dir_all(&dest).map_err(io("creating")),
        T::Regular | T::Continuous | T::GNUSparse => {
            budget.check(entry.size())?;
            make_parent(&dest)?;
            remove_existing(&dest)?;
            let mut out = fs::File::create(&dest).map_err(io("creating"))?;
            let n = io::copy(entry, &mut out).map_err(io("writing"))?;
            budget.spend(n)
        }
        T::Link => {
            // A hard link names its target by its path in the layer; the prefix applies to it too.
            let linked = entry
                .link_name()
                .ok()
                .flatten()
                .and_then(|l| normalise(&l))
                .and_then(|l| under_prefix(target, &l))
                .ok_or_else(|| {
                    malformed(
                        blob,
                        format!("hard link {} has no target in the model", rel.display()),
                    )
                })?;
            copy_link(&root.join(linked), &dest, root, rel, blob, budget)
        }
        T::Symlink => Err(malformed(
            blob,
            format!(
                "{} is a symlink; a model is plain files (the digest refuses links)",
                rel.display()
            ),
        )),
        T::XHeader | T::XGlobalHeader | T::GNULongName | T::GNULongLink => Ok(()),
        other => Err(malformed(
            blob,
            format!("{} is a {other:?} entry, not a file", rel.display()),
        )),
    }
}

fn copy_link(
    from: &Path,
    dest: &Path,
    root: &Path,
    rel: &Path,
    blob: &Path,
    budget: &mut Budget,
) -> Result<(), FetchError> {
    let meta = fs::symlink_metadata(from)
        .ok()
        .filter(|m| m.is_file() && from.starts_with(root));
    let Some(meta) = meta else {
        return Err(malformed(
            blob,
            format!("hard link {} points at no file of the model", rel.display()),
        ));
    };
    budget.check(meta.len())?;
    make_parent(dest)?;
    remove_existing(dest)?;
    let n = fs::copy(from, dest).map_err(FetchError::io(format!("copying into {}", dest.display())))?;
    budget.spend(n)
}

fn make_parent(dest: &Path) -> Result<(), FetchError> {
    match dest.parent() {
        Some(p) => fs::create_dir_all(p).map_err(FetchError::io(format!("creating {}", p.display()))),
        None => Ok(()),
    }
}

/// A later layer's entry replaces an earlier one's, file or directory.
fn remove_existing(dest: &Path) -> Result<(), FetchError> {
    match fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(dest),
        Ok(_) => fs::remove_file(dest),
        Err(_) => Ok(()),
    }
    .map_err(FetchError::io(format!("replacing {}", dest.display())))
}

/// First pass over an image layer: its whiteouts remove what earlier layers wrote.
fn apply_whiteouts(blob: &Path, compression: Compression, target: &Target) -> Result<(), FetchError> {
    let mut archive = tar::Archive::new(open(blob, compression)?);
    let entries = archive
        .entries()
        .map_err(|e| malformed(blob, format!("not a tar: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| malformed(blob, format!("bad tar entry: {e}")))?;
        let raw = entry
            .path()
            .map_err(|e| malformed(blob, format!("bad entry path: {e}")))?
            .into_owned();
        let Some(path) = normalise(&raw) else {
            return Err(malformed(blob, format!("unsafe path {}", raw.display())));
        };
        let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let Some(hidden) = name.strip_prefix(".wh.") else {
            continue;
        };
        let dir = path.parent().unwrap_or(Path::new(""));
        let hidden_path = if hidden == ".wh..opq" {
            // Opaque: the directory keeps only what this layer (and later ones) put in it.
            dir.to_path_buf()
        } else {
            dir.join(hidden)
        };
        match affected(target, &hidden_path) {
            Some(rel) if rel.as_os_str().is_empty() => clear(target.root)?,
            Some(rel) if hidden == ".wh..opq" => {
                let d = target.root.join(rel);
                if d.is_dir() {
                    clear(&d)?;
                }
            }
            Some(rel) => remove_existing(&target.root.join(rel))?,
            None => {}
        }
    }
    Ok(())
}

/// What of the target a whiteout of `path` (a layer path) hides: a path under the prefix (relative to
/// the root), the whole root (empty) when `path` is the prefix or one of its ancestors, or nothing.
fn affected(target: &Target, path: &Path) -> Option<PathBuf> {
    if let Ok(rest) = path.strip_prefix(target.prefix) {
        return Some(rest.to_path_buf());
    }
    target.prefix.starts_with(path).then(PathBuf::new)
}

fn clear(dir: &Path) -> Result<(), FetchError> {
    for e in fs::read_dir(dir)
        .map_err(FetchError::io(format!("reading {}", dir.display())))?
        .flatten()
    {
        remove_existing(&e.path())?;
    }
    Ok(())
}
