//! `oci://registry/repository[:tag]@sha256:…`: a model in an OCI registry, pinned by its manifest
//! digest — a CNCF ModelPack artifact ([`modelpack`]) or a model image ([`image`]) — pulled over the
//! distribution API with `oci_client` (token auth, the registry's credentials from a docker config,
//! `Range` resumes) into staging. A model image can also be mounted by the node as an image volume
//! (the operator's `delivery: ImageVolume`); then nothing is pulled here, and [`check_signature`] is
//! what `fetch --mounted` asks of this module.
//!
//! Flow: signature (when a key is configured) → the manifest, verified against its digest →
//! every layer checked for its kind before a byte of it is pulled → blobs side by side, each verified
//! → assembled into staging. The canonical digest of the result is checked by the caller, as for every
//! source.
//!
//! Invariants: the signature is checked before anything else is downloaded; blobs live outside the
//! staging tree (in the node cache's `.blobs`, where a partial blob survives for the next attempt to
//! resume, or in a directory beside staging removed with it), so nothing but model files is ever
//! digested.

pub mod auth;
pub mod blobs;
pub mod client;
pub mod image;
pub mod manifest;
pub mod modelpack;
pub mod reference;
pub mod signature;
pub mod unpack;

pub use reference::OciRef;

use super::super::limits::Budget;
use super::super::progress::Phase;
use super::super::{FetchError, FetchRequest, blocking, stage};
use std::path::{Path, PathBuf};

/// Pulls the artifact `r` pins into `staging`, within `budget`.
pub async fn download_into(
    r: &OciRef,
    staging: &Path,
    req: &FetchRequest,
    budget: &mut Budget,
) -> Result<(), FetchError> {
    let shown = r.display();
    let client = client::connect(&req.access, r).await?;
    let auth = client::auth_for(&req.access, r);
    if let Some(key) = &req.signature_key {
        req.progress.enter(Phase::Signature);
        signature::verify(&client, &auth, r, key).await?;
    }
    let artifact = manifest::fetch(&client, &auth, r).await?;
    let layers = manifest::layers(&artifact)?;
    match artifact.shape {
        manifest::Shape::ModelPack => modelpack::check(&layers, &shown)?,
        manifest::Shape::Image => image::check(&layers, &shown)?,
    }
    budget.check(artifact.layer_bytes())?;
    req.progress.expect(artifact.layer_bytes());
    req.progress.enter(Phase::Pull);
    let blob_dir = BlobDir::new(req.cache.as_deref(), staging)?;
    blobs::pull_all(
        &client,
        &artifact.reference,
        &layers,
        blob_dir.path(),
        &req.progress,
    )
    .await?;
    let (root, dir, mut b) = (
        staging.to_path_buf(),
        blob_dir.path().to_path_buf(),
        budget.clone(),
    );
    let shape = artifact.shape;
    *budget = blocking(move || {
        match shape {
            manifest::Shape::ModelPack => modelpack::assemble(&layers, &dir, &root, &mut b)?,
            manifest::Shape::Image => image::assemble(&layers, &dir, &root, &mut b, &shown)?,
        }
        Ok(b)
    })
    .await?;
    drop(blob_dir);
    Ok(())
}

/// For a mounted artifact (an image volume): checks that a signature of `r` verifies with the key.
pub async fn check_signature(r: &OciRef, req: &FetchRequest) -> Result<(), FetchError> {
    let Some(key) = &req.signature_key else {
        return Ok(());
    };
    req.progress.enter(Phase::Signature);
    let client = client::connect(&req.access, r).await?;
    signature::verify(&client, &client::auth_for(&req.access, r), r, key).await
}

/// Where blobs are pulled to: the cache's `.blobs` (kept: partial blobs resume there), or a private
/// directory beside staging, removed on drop.
struct BlobDir {
    path: PathBuf,
    owned: bool,
}

impl BlobDir {
    fn new(cache: Option<&Path>, staging: &Path) -> Result<BlobDir, FetchError> {
        if let Some(cache) = cache {
            let path = cache.join(".blobs");
            if std::fs::create_dir_all(&path).is_ok() {
                return Ok(BlobDir { path, owned: false });
            }
        }
        let parent = staging.parent().unwrap_or(staging);
        Ok(BlobDir {
            path: stage::unique_dir(parent, ".oci-blobs-")?,
            owned: true,
        })
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BlobDir {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
