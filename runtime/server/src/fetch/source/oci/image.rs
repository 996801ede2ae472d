//! A model image: a runnable-image-shaped OCI image (config with `rootfs.diff_ids`, tar layers) whose
//! file system holds the model under `/models` — KServe's "modelcar" layout, so one image serves both.
//! Mounted as a Kubernetes image volume, the node pulls it; fetched (`delivery: Fetch`), its layers
//! are applied here in order, whiteouts included, and only `/models` is kept.
//!
//! Invariants: only entries under `models/` are written; the layers' media types must be tar layers
//! (OCI or Docker, plain, gzip or zstd); an image without anything under `/models` is refused by name.

use super::super::super::FetchError;
use super::super::super::limits::Budget;
use super::blobs::blob_path;
use super::unpack::{self, Compression, Target};
use oci_client::manifest::OciDescriptor;
use std::path::Path;

/// Where a model image keeps the model (relative to its root).
pub const MODEL_DIR: &str = "models";

const TAR_LAYERS: [&str; 8] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];

/// Checks every layer is a tar layer before anything is pulled.
pub fn check(layers: &[OciDescriptor], shown: &str) -> Result<(), FetchError> {
    match layers
        .iter()
        .find(|l| !TAR_LAYERS.contains(&l.media_type.as_str()))
    {
        Some(l) => Err(FetchError::Malformed(format!(
            "{shown}: layer {} has media type {}, not an image layer",
            l.digest, l.media_type
        ))),
        None => Ok(()),
    }
}

/// Applies the layers (pulled into `blobs`) in order into `root`, keeping `/models`; each blob is
/// removed once applied.
pub fn assemble(
    layers: &[OciDescriptor],
    blobs: &Path,
    root: &Path,
    budget: &mut Budget,
    shown: &str,
) -> Result<(), FetchError> {
    let target = Target {
        root,
        prefix: Path::new(MODEL_DIR),
        whiteouts: true,
    };
    for l in layers {
        let blob = blob_path(blobs, &l.digest);
        unpack::apply(&blob, Compression::of(&l.media_type), &target, budget)?;
        let last_use = !layers
            .iter()
            .skip_while(|x| !std::ptr::eq(*x, l))
            .skip(1)
            .any(|x| x.digest == l.digest);
        if last_use {
            let _ = std::fs::remove_file(&blob);
        }
    }
    let empty = std::fs::read_dir(root)
        .map(|mut d| d.next().is_none())
        .unwrap_or(true);
    if empty {
        return Err(FetchError::Malformed(format!(
            "{shown}: the image has no files under /{MODEL_DIR} (a model image keeps the model there)"
        )));
    }
    Ok(())
}
