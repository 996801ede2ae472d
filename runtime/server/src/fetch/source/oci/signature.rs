//! Offline checks of cosign key-pair signatures (cosign's default: ECDSA P-256 over SHA-256, the
//! "simple signing" payload), with the public key the deployment names and nothing else — no
//! transparency log, no network beyond the registry that holds the artifact.
//!
//! Where cosign keeps them: a manifest tagged `sha256-<hex>.sig` in the artifact's repository, whose
//! layers (`application/vnd.dev.cosign.simplesigning.v1+json`) are payloads
//! `{"critical": {"identity": {"docker-reference"}, "image": {"docker-manifest-digest"}, "type":
//! "cosign container image signature"}, …}` with the base64 DER signature in the layer annotation
//! `dev.cosignproject.cosign/signature`.
//!
//! Invariants: a signature counts only if it verifies with the key over the payload's exact bytes
//! (fetched by digest, size-bounded, hashed) *and* the payload names the pinned manifest digest; a
//! signature that verifies but names another digest is `SignatureDigestMismatch`, none that verifies
//! `SignatureInvalid`, no signature manifest `SignatureNotFound`. The `docker-reference` claim is not
//! compared: mirrors and copies keep their signatures valid, and the digest is what binds.

use super::super::super::FetchError;
use super::client;
use super::reference::OciRef;
use base64::Engine as _;
use oci_client::manifest::OciImageManifest;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey as _;
use sha2::{Digest as _, Sha256};
use std::path::Path;

const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
const CLAIM_TYPE: &str = "cosign container image signature";
/// Most bytes of one signed payload read.
const MAX_PAYLOAD_BYTES: usize = 64 << 10;

/// A public key signatures must verify with.
#[derive(Clone, Debug)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// Reads a PEM `PUBLIC KEY` (what `cosign generate-key-pair` writes as `cosign.pub`).
    pub fn read(path: &Path) -> Result<PublicKey, FetchError> {
        let pem =
            std::fs::read_to_string(path).map_err(FetchError::io(format!("reading {}", path.display())))?;
        Self::parse(&pem)
            .map_err(|why| FetchError::InvalidArgument(format!("public key {}: {why}", path.display())))
    }

    /// Parses a PEM `PUBLIC KEY`.
    pub fn parse(pem: &str) -> Result<PublicKey, String> {
        VerifyingKey::from_public_key_pem(pem.trim())
            .map(PublicKey)
            .map_err(|_| {
                "not a PEM ECDSA P-256 public key (cosign's default key type is the one supported)"
                    .to_string()
            })
    }
}

/// The tag cosign stores `digest`'s signatures under.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replace(':', "-"))
}

/// Checks that a signature of `r`'s manifest digest verifies with `key`.
pub async fn verify(
    client: &oci_client::Client,
    auth: &oci_client::secrets::RegistryAuth,
    r: &OciRef,
    key: &PublicKey,
) -> Result<(), FetchError> {
    let shown = r.display();
    let tag = signature_tag(&r.manifest_digest);
    let sig_ref = oci_client::Reference::with_tag(r.registry.clone(), r.repository.clone(), tag.clone());
    let accepted = [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ];
    let (bytes, _) = match client.pull_manifest_raw(&sig_ref, auth, &accepted).await {
        Ok(found) => found,
        Err(e) => {
            return Err(match client::error(e, &shown, &format!("signature {tag}")) {
                FetchError::SourceUnavailable(m) if m.contains("not found") => FetchError::Signature {
                    reason: "SignatureNotFound",
                    message: format!("{shown}: not signed: the registry has no {tag} (cosign sign … --key)"),
                },
                other => other,
            });
        }
    };
    let manifest: OciImageManifest = serde_json::from_slice(&bytes).map_err(|_| FetchError::Signature {
        reason: "SignatureNotFound",
        message: format!("{shown}: {tag} is not a signature manifest"),
    })?;
    let mut other_digest = None;
    for layer in manifest.layers.iter().filter(|l| l.media_type == PAYLOAD_TYPE) {
        let Some(sig) = layer
            .annotations
            .as_ref()
            .and_then(|a| a.get(SIGNATURE_ANNOTATION))
        else {
            continue;
        };
        let payload = pull_payload(client, &sig_ref, layer, &shown).await?;
        if !verifies(key, &payload, sig) {
            continue;
        }
        match signed_digest(&payload) {
            Some(d) if d == r.manifest_digest => return Ok(()),
            Some(d) => other_digest = Some(d),
            None => {}
        }
    }
    Err(match other_digest {
        Some(d) => FetchError::Signature {
            reason: "SignatureDigestMismatch",
            message: format!(
                "{shown}: the signature under {tag} verifies with the key but signs {d}, another manifest"
            ),
        },
        None => FetchError::Signature {
            reason: "SignatureInvalid",
            message: format!("{shown}: no signature under {tag} verifies with the configured public key"),
        },
    })
}

async fn pull_payload(
    client: &oci_client::Client,
    sig_ref: &oci_client::Reference,
    layer: &oci_client::manifest::OciDescriptor,
    shown: &str,
) -> Result<Vec<u8>, FetchError> {
    let mut layer = layer.clone();
    layer.urls = None;
    if layer.size < 0 || layer.size as usize > MAX_PAYLOAD_BYTES {
        return Err(FetchError::Signature {
            reason: "SignatureInvalid",
            message: format!(
                "{shown}: a signature payload of {} bytes (the limit is {MAX_PAYLOAD_BYTES})",
                layer.size
            ),
        });
    }
    let mut payload = Vec::new();
    client
        .pull_blob(sig_ref, &layer, &mut payload)
        .await
        .map_err(|e| client::error(e, shown, &format!("signature payload {}", layer.digest)))?;
    let actual = format!("sha256:{}", hex::encode(Sha256::digest(&payload)));
    if actual != layer.digest || payload.len() > MAX_PAYLOAD_BYTES {
        return Err(FetchError::Signature {
            reason: "SignatureInvalid",
            message: format!(
                "{shown}: a signature payload does not match its digest {}",
                layer.digest
            ),
        });
    }
    Ok(payload)
}

/// Whether the base64 DER signature `sig` over `payload` verifies with `key`.
pub fn verifies(key: &PublicKey, payload: &[u8], sig: &str) -> bool {
    let Ok(der) = base64::engine::general_purpose::STANDARD.decode(sig.trim()) else {
        return false;
    };
    let Ok(signature) = Signature::from_der(&der) else {
        return false;
    };
    key.0.verify(payload, &signature).is_ok()
}

/// The manifest digest a simple-signing payload claims, if it is one.
pub fn signed_digest(payload: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    let critical = v.get("critical")?;
    if critical.get("type")?.as_str()? != CLAIM_TYPE {
        return None;
    }
    Some(
        critical
            .get("image")?
            .get("docker-manifest-digest")?
            .as_str()?
            .to_string(),
    )
}
