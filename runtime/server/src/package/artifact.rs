//! The OCI artifact `package` pushes, as data: blobs (each with its digest, size, media type and where
//! its bytes come from), the config and the manifest — a CNCF ModelPack artifact
//! (`artifactType application/vnd.cncf.model.manifest.v1+json`, one raw layer per file with its path
//! in `org.cncf.model.filepath`) or a model image (an image config with `rootfs.diff_ids`, tar layers
//! holding `/models`).
//!
//! Invariants: the manifest and config bytes are a function of the files alone (serde_json of structs
//! with a fixed field order, no clock), so two runs over the same files give the same digests; the
//! model's canonical digest rides in the manifest's `io.modelfleet.model.digest` annotation.

use super::plan::{self, Model, TarLayer};
use serde_json::json;
use sha2::{Digest as _, Sha256};

/// `artifactType` of a ModelPack manifest.
pub const MODELPACK_ARTIFACT_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";
/// The manifest annotation carrying the model's canonical digest.
pub const DIGEST_ANNOTATION: &str = "io.modelfleet.model.digest";
const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// Which shape to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A CNCF ModelPack artifact: fetched over the distribution API into the node cache.
    Modelpack,
    /// A model image: mounted by the node as a Kubernetes image volume (`delivery: ImageVolume`).
    Image,
}

/// Where a blob's bytes come from.
#[derive(Clone, Debug)]
pub enum Body {
    /// One file, as it is (a ModelPack raw layer).
    File(std::path::PathBuf),
    /// A tar layer of some files (a model image).
    Tar(TarLayer),
    /// Bytes in memory (the config).
    Bytes(Vec<u8>),
}

/// One blob of the artifact.
#[derive(Clone, Debug)]
pub struct Blob {
    /// `sha256:<hex>`.
    pub digest: String,
    /// Bytes.
    pub size: u64,
    /// The descriptor's media type.
    pub media_type: String,
    /// The descriptor's annotations (ordered).
    pub annotations: Vec<(String, String)>,
    /// Its bytes.
    pub body: Body,
}

/// The whole artifact.
pub struct Artifact {
    /// Layers, in manifest order.
    pub layers: Vec<Blob>,
    /// The config blob.
    pub config: Blob,
    /// The manifest's bytes.
    pub manifest: Vec<u8>,
    /// `sha256:` of the manifest.
    pub manifest_digest: String,
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The ModelPack layer media type for a file: weights, docs, or (everything else) weight configs —
/// tokenizers, chat templates, configuration.
pub fn modelpack_kind(rel: &str) -> &'static str {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let upper = name.to_ascii_uppercase();
    if [
        "safetensors",
        "gguf",
        "bin",
        "pt",
        "pth",
        "onnx",
        "h5",
        "msgpack",
        "ckpt",
    ]
    .contains(&ext.as_str())
    {
        "application/vnd.cncf.model.weight.v1.raw"
    } else if ext == "md"
        || upper.starts_with("README")
        || upper.starts_with("LICENSE")
        || upper.starts_with("NOTICE")
    {
        "application/vnd.cncf.model.doc.v1.raw"
    } else {
        "application/vnd.cncf.model.weight.config.v1.raw"
    }
}

fn descriptor(b: &Blob) -> serde_json::Value {
    let mut d = json!({"mediaType": b.media_type, "digest": b.digest, "size": b.size});
    if !b.annotations.is_empty() {
        let map: serde_json::Map<String, serde_json::Value> =
            b.annotations.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        d["annotations"] = serde_json::Value::Object(map);
    }
    d
}

/// The artifact for `model` in `format`; `name` goes into the ModelPack descriptor.
pub fn build(model: &Model, format: Format, name: &str) -> std::io::Result<Artifact> {
    let mtime = plan::source_date_epoch();
    let layers: Vec<Blob> = match format {
        Format::Modelpack => model
            .files
            .iter()
            .map(|f| {
                let metadata = json!({"name": f.rel, "mode": 0o644, "uid": 0, "gid": 0, "size": f.size,
                    "mtime": time_rfc3339(mtime), "typeflag": 48});
                Blob {
                    digest: format!("sha256:{}", f.sha256),
                    size: f.size,
                    media_type: modelpack_kind(&f.rel).into(),
                    annotations: vec![
                        ("org.cncf.model.file.metadata+json".into(), metadata.to_string()),
                        ("org.cncf.model.filepath".into(), f.rel.clone()),
                    ],
                    body: Body::File(f.path.clone()),
                }
            })
            .collect(),
        Format::Image => {
            let mut out = Vec::new();
            for layer in plan::image_layers(model) {
                let (digest, size) = plan::tar_layer_digest(&layer, model, mtime)?;
                out.push(Blob {
                    digest,
                    size,
                    media_type: "application/vnd.oci.image.layer.v1.tar".into(),
                    annotations: vec![],
                    body: Body::Tar(layer),
                });
            }
            out
        }
    };
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
    let (config_type, config_json) = match format {
        Format::Modelpack => (
            "application/vnd.cncf.model.config.v1+json",
            json!({"descriptor": {"name": name}, "modelfs": {"type": "layers", "diffIds": diff_ids},
                "config": {"format": model_format(model)}}),
        ),
        Format::Image => (
            "application/vnd.oci.image.config.v1+json",
            json!({"architecture": "amd64", "os": "linux", "config": {},
                "rootfs": {"type": "layers", "diff_ids": diff_ids}}),
        ),
    };
    let config_bytes = serde_json::to_vec(&config_json).expect("JSON of plain values");
    let config = Blob {
        digest: sha256(&config_bytes),
        size: config_bytes.len() as u64,
        media_type: config_type.into(),
        annotations: vec![],
        body: Body::Bytes(config_bytes),
    };
    let mut manifest = json!({"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": descriptor(&config), "layers": layers.iter().map(descriptor).collect::<Vec<_>>(),
        "annotations": {DIGEST_ANNOTATION: model.digest}});
    if format == Format::Modelpack {
        manifest["artifactType"] = json!(MODELPACK_ARTIFACT_TYPE);
    }
    let manifest = serde_json::to_vec(&manifest).expect("JSON of plain values");
    Ok(Artifact {
        manifest_digest: sha256(&manifest),
        layers,
        config,
        manifest,
    })
}

/// `safetensors`, `gguf`, or empty when the files say neither.
fn model_format(model: &Model) -> &'static str {
    if model.files.iter().any(|f| f.rel.ends_with(".gguf")) {
        "gguf"
    } else if model.files.iter().any(|f| f.rel.ends_with(".safetensors")) {
        "safetensors"
    } else {
        ""
    }
}

/// Seconds since the epoch as RFC 3339 (UTC), for the ModelPack file metadata.
fn time_rfc3339(secs: u64) -> String {
    jiff::Timestamp::from_second(secs as i64)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}
