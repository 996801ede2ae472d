//! A CNCF ModelPack artifact (modelpack/model-spec) assembled into the model directory: each layer is
//! one file (`…v1.raw`, its path in the `org.cncf.model.filepath` annotation) or a tar of files
//! (`…v1.tar`, `+gzip`, `+zstd`), of any kind the spec names — weights, weight configs (tokenizer,
//! chat template), docs, code, datasets — so the directory holds every file the artifact carries and
//! its canonical digest is the one `modelfleet-runtime digest` gives for the packaged directory.
//!
//! Invariants: a raw layer's path must be a safe relative path, and no two layers may write one path;
//! a raw blob is moved into place (never copied: the bytes verified on arrival are the bytes served);
//! a layer of a media type outside the spec is refused by name.

use super::super::super::FetchError;
use super::super::super::limits::Budget;
use super::blobs::blob_path;
use super::unpack::{self, Compression, Target};
use oci_client::manifest::OciDescriptor;
use std::collections::BTreeSet;
use std::path::Path;

/// The layer annotation holding a file's path in the model.
pub const FILEPATH_ANNOTATION: &str = "org.cncf.model.filepath";
/// The media-type prefix of every ModelPack layer.
const LAYER_PREFIX: &str = "application/vnd.cncf.model.";
/// The kinds of layer the spec defines.
const KINDS: [&str; 5] = ["weight", "weight.config", "doc", "code", "dataset"];

/// How one layer is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// The file itself.
    Raw,
    /// A tar of files, maybe compressed.
    Tar(Compression),
}

/// The packing of a ModelPack layer media type, or `None` if the spec does not define it.
pub fn packing(media_type: &str) -> Option<Packing> {
    let rest = media_type.strip_prefix(LAYER_PREFIX)?;
    let (kind, format) = rest.split_once(".v1.")?;
    if !KINDS.contains(&kind) {
        return None;
    }
    match format {
        "raw" => Some(Packing::Raw),
        "tar" => Some(Packing::Tar(Compression::None)),
        "tar+gzip" => Some(Packing::Tar(Compression::Gzip)),
        "tar+zstd" => Some(Packing::Tar(Compression::Zstd)),
        _ => None,
    }
}

/// Checks every layer before anything is pulled: a known media type, and a safe, unique path for raw
/// layers.
pub fn check(layers: &[OciDescriptor], shown: &str) -> Result<(), FetchError> {
    let mut paths = BTreeSet::new();
    for l in layers {
        let bad = |why: String| FetchError::Malformed(format!("{shown}: layer {}: {why}", l.digest));
        match packing(&l.media_type) {
            None => {
                return Err(bad(format!(
                    "media type {} is not a ModelPack layer type",
                    l.media_type
                )));
            }
            Some(Packing::Raw) => {
                let path = raw_path(l).ok_or_else(|| {
                    bad(format!(
                        "a raw layer needs a safe relative path in the {FILEPATH_ANNOTATION} annotation"
                    ))
                })?;
                if !paths.insert(path.clone()) {
                    return Err(bad(format!("a second layer for {path}")));
                }
            }
            Some(Packing::Tar(_)) => {}
        }
    }
    Ok(())
}

fn raw_path(l: &OciDescriptor) -> Option<String> {
    let p = l.annotations.as_ref()?.get(FILEPATH_ANNOTATION)?;
    super::super::safe_relative(p).map(|_| p.clone())
}

/// Puts every layer (pulled into `blobs`) into `root`, in manifest order.
pub fn assemble(
    layers: &[OciDescriptor],
    blobs: &Path,
    root: &Path,
    budget: &mut Budget,
) -> Result<(), FetchError> {
    for l in layers {
        let blob = blob_path(blobs, &l.digest);
        match packing(&l.media_type) {
            Some(Packing::Raw) => {
                let rel = raw_path(l).expect("checked before the pull");
                let dest = root.join(&rel);
                if let Some(parent) = dest.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(FetchError::io(format!("creating {}", parent.display())))?;
                }
                budget.spend(l.size as u64)?;
                // Two layers may share one blob (identical files): move the last use, copy the others.
                let more = layers
                    .iter()
                    .skip_while(|x| !std::ptr::eq(*x, l))
                    .skip(1)
                    .any(|x| x.digest == l.digest);
                // A rename needs one file system (the blobs and staging are side by side); copy otherwise.
                if more {
                    std::fs::copy(&blob, &dest).map(|_| ())
                } else {
                    std::fs::rename(&blob, &dest)
                        .or_else(|_| std::fs::copy(&blob, &dest).and_then(|_| std::fs::remove_file(&blob)))
                }
                .map_err(FetchError::io(format!("placing {}", dest.display())))?;
            }
            Some(Packing::Tar(compression)) => {
                let target = Target {
                    root,
                    prefix: Path::new(""),
                    whiteouts: false,
                };
                unpack::apply(&blob, compression, &target, budget)?;
            }
            None => unreachable!("checked before the pull"),
        }
    }
    Ok(())
}
