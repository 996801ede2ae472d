//! The pinned manifest: fetched by digest, its bytes checked against that digest, an index resolved to
//! its linux entry for this machine's architecture, and classified as a CNCF ModelPack artifact or a
//! model image (a runnable-image-shaped manifest whose file system holds the model).
//!
//! Invariants: nothing in a manifest is trusted before its bytes hash to the digest that named it
//! (the URI's, or the index entry's); an artifact of any other kind is refused by name, never guessed
//! at; blob `urls` (foreign locations a manifest may list) are dropped, so blobs come only from the
//! registry the URI names.

use super::super::super::FetchError;
use super::client;
use super::reference::OciRef;
use oci_client::manifest::{OciDescriptor, OciImageIndex, OciImageManifest};
use sha2::{Digest as _, Sha256};

/// `artifactType` of a CNCF ModelPack manifest.
pub const MODELPACK_ARTIFACT_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";
/// Media type of a ModelPack config blob.
pub const MODELPACK_CONFIG: &str = "application/vnd.cncf.model.config.v1+json";
/// Media types of image configs (OCI, Docker).
const IMAGE_CONFIGS: [&str; 2] = [
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];
const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const ACCEPTED: [&str; 4] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    INDEX_TYPES[0],
    INDEX_TYPES[1],
];
/// Most bytes of a manifest read.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// What a manifest describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A CNCF ModelPack artifact: one layer per file (or a tar of files), paths in annotations.
    ModelPack,
    /// A runnable-image-shaped manifest: tar layers whose file system holds the model under
    /// [`super::image::MODEL_DIR`].
    Image,
}

/// A verified manifest.
#[derive(Clone, Debug)]
pub struct Artifact {
    /// Where it was found (an index's entry, or the URI itself).
    pub reference: OciRef,
    /// The manifest.
    pub manifest: OciImageManifest,
    /// Its kind.
    pub shape: Shape,
}

impl Artifact {
    /// Total bytes of the layers, as the manifest declares them.
    pub fn layer_bytes(&self) -> u64 {
        self.manifest.layers.iter().map(|l| l.size.max(0) as u64).sum()
    }
}

/// Fetches and verifies the manifest `r` pins (resolving an index), and classifies it.
pub async fn fetch(
    client: &oci_client::Client,
    auth: &oci_client::secrets::RegistryAuth,
    r: &OciRef,
) -> Result<Artifact, FetchError> {
    let shown = r.display();
    let bytes = pull_verified(client, auth, r, &shown).await?;
    let media_type = media_type_of(&bytes, &shown)?;
    let (reference, bytes) = if INDEX_TYPES.contains(&media_type.as_str()) {
        let index: OciImageIndex = serde_json::from_slice(&bytes)
            .map_err(|e| FetchError::SourceUnavailable(format!("{shown}: not an image index: {e}")))?;
        let entry = platform_entry(&index).ok_or_else(|| {
            FetchError::Malformed(format!(
                "{shown}: the index has no linux/{} manifest",
                std::env::consts::ARCH
            ))
        })?;
        let at = r.at(&entry);
        let bytes = pull_verified(client, auth, &at, &shown).await?;
        (at, bytes)
    } else {
        (r.clone(), bytes)
    };
    let mut manifest: OciImageManifest = serde_json::from_slice(&bytes)
        .map_err(|e| FetchError::SourceUnavailable(format!("{shown}: not an image manifest: {e}")))?;
    for layer in &mut manifest.layers {
        layer.urls = None;
    }
    let shape = classify(&manifest).map_err(|why| FetchError::Malformed(format!("{shown}: {why}")))?;
    Ok(Artifact {
        reference,
        manifest,
        shape,
    })
}

/// The manifest's bytes, checked against the digest that named them.
async fn pull_verified(
    client: &oci_client::Client,
    auth: &oci_client::secrets::RegistryAuth,
    r: &OciRef,
    shown: &str,
) -> Result<Vec<u8>, FetchError> {
    let what = format!("manifest {}", r.manifest_digest);
    let (bytes, _) = client
        .pull_manifest_raw(&r.client_ref(), auth, &ACCEPTED)
        .await
        .map_err(|e| client::error(e, shown, &what))?;
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(FetchError::SourceUnavailable(format!(
            "{shown}: {what} is over {MAX_MANIFEST_BYTES} bytes"
        )));
    }
    let actual = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    if actual != r.manifest_digest {
        return Err(FetchError::DigestMismatch {
            uri: shown.to_string(),
            expected: r.manifest_digest.clone(),
            actual,
        });
    }
    Ok(bytes.to_vec())
}

fn media_type_of(bytes: &[u8], shown: &str) -> Result<String, FetchError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Head {
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
    }
    let head: Head = serde_json::from_slice(bytes)
        .map_err(|e| FetchError::SourceUnavailable(format!("{shown}: the manifest is not JSON: {e}")))?;
    Ok(match head.media_type {
        Some(m) => m,
        None if head.manifests.is_some() => INDEX_TYPES[0].to_string(),
        None => ACCEPTED[0].to_string(),
    })
}

/// The digest of the index entry for linux on this architecture.
fn platform_entry(index: &OciImageIndex) -> Option<String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    index
        .manifests
        .iter()
        .find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os.to_string() == "linux" && p.architecture.to_string() == arch)
        })
        .map(|m| m.digest.clone())
}

/// ModelPack or image, from the artifact type and the config's media type.
pub fn classify(m: &OciImageManifest) -> Result<Shape, String> {
    let config = m.config.media_type.as_str();
    if m.artifact_type.as_deref() == Some(MODELPACK_ARTIFACT_TYPE) || config == MODELPACK_CONFIG {
        return Ok(Shape::ModelPack);
    }
    if IMAGE_CONFIGS.contains(&config) {
        return Ok(Shape::Image);
    }
    Err(format!(
        "an artifact of type {} (config {config}) is neither a CNCF ModelPack artifact ({MODELPACK_ARTIFACT_TYPE}) \
         nor a model image",
        m.artifact_type.as_deref().unwrap_or("<none>")
    ))
}

/// The layers' descriptors, each checked for a digest of the sha256 form and a size that is not
/// negative.
pub fn layers(a: &Artifact) -> Result<Vec<OciDescriptor>, FetchError> {
    for l in &a.manifest.layers {
        if super::super::super::validate_digest(&l.digest).is_err() || l.size < 0 {
            return Err(FetchError::Malformed(format!(
                "{}: layer {:?} has an invalid digest or size",
                a.reference.display(),
                l.digest
            )));
        }
    }
    Ok(a.manifest.layers.clone())
}
