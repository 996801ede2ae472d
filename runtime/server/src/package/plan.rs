//! What `package` writes, decided before a byte moves: the model's files (sorted, hashed), and the
//! layers that hold them — one raw layer per file for a ModelPack artifact, tar layers under `/models`
//! for a model image (small files together in the first, each large file in its own) — with every
//! blob's digest and size known, so the manifest and config can be written and blobs the registry
//! already has are not sent again.
//!
//! Invariants: byte-for-byte reproducible from the same files: files in bytewise path order, tar
//! headers with fixed owners (0:0), modes (0644, 0755), an mtime of `SOURCE_DATE_EPOCH` (else 0) and no
//! user or group names; no timestamp anywhere else. A symlink or special file in the model is refused,
//! as the canonical digest refuses it.

use crate::digest::{DigestError, manifest};
use sha2::{Digest as _, Sha256};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// The directory a model image keeps the model in (KServe's modelcar layout).
pub const IMAGE_MODEL_DIR: &str = "models";
/// Files below this size share the image's first layer.
pub const SMALL_FILE_BYTES: u64 = 64 << 20;
/// Most layers of a model image (overlay mounts of more layers fail on some nodes).
pub const MAX_IMAGE_LAYERS: usize = 100;

/// One file of the model.
#[derive(Clone, Debug)]
pub struct ModelFile {
    /// Its path relative to the model's root, `/`-separated.
    pub rel: String,
    /// Where it is on disk.
    pub path: PathBuf,
    /// Its size.
    pub size: u64,
    /// Hex SHA-256 of its bytes.
    pub sha256: String,
}

/// The model's files, sorted, and its canonical digest.
pub struct Model {
    /// Sorted by path bytes.
    pub files: Vec<ModelFile>,
    /// `sha256:` canonical digest (docs/design.md).
    pub digest: String,
}

/// Reads and hashes the files of a model directory or single file.
pub fn model(root: &Path) -> Result<Model, DigestError> {
    let lines = manifest(root)?;
    let single = std::fs::symlink_metadata(root)
        .map(|m| m.is_file())
        .unwrap_or(false);
    let mut files = Vec::with_capacity(lines.len());
    for (rel, sha256) in &lines {
        let path = if single {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        let size = std::fs::metadata(&path)
            .map_err(|source| DigestError::Io {
                path: path.clone(),
                source,
            })?
            .len();
        files.push(ModelFile {
            rel: rel.clone(),
            path,
            size,
            sha256: sha256.clone(),
        });
    }
    Ok(Model {
        files,
        digest: crate::digest::digest_of_manifest(&lines),
    })
}

/// The mtime written into tar headers and file metadata: `SOURCE_DATE_EPOCH`, else 0.
pub fn source_date_epoch() -> u64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// One tar layer of a model image: the files it holds.
#[derive(Clone, Debug)]
pub struct TarLayer {
    /// Indexes into the model's files.
    pub files: Vec<usize>,
}

/// The image's tar layers: small files together first, then each large file alone.
pub fn image_layers(model: &Model) -> Vec<TarLayer> {
    let (small, large): (Vec<usize>, Vec<usize>) =
        (0..model.files.len()).partition(|&i| model.files[i].size < SMALL_FILE_BYTES);
    let mut layers = Vec::new();
    if !small.is_empty() {
        layers.push(TarLayer { files: small });
    }
    layers.extend(large.into_iter().map(|i| TarLayer { files: vec![i] }));
    layers
}

/// Writes a tar layer: the directories the files need (once each, in order), then the files under
/// `models/`, then the end-of-archive blocks.
pub fn write_tar_layer(layer: &TarLayer, model: &Model, out: impl Write, mtime: u64) -> io::Result<()> {
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Deterministic);
    let mut dirs: Vec<String> = Vec::new();
    for &i in &layer.files {
        let rel = &model.files[i].rel;
        let mut parts: Vec<&str> = rel.split('/').collect();
        parts.pop();
        let mut dir = IMAGE_MODEL_DIR.to_string();
        let mut chain = vec![dir.clone()];
        for p in parts {
            dir = format!("{dir}/{p}");
            chain.push(dir.clone());
        }
        for d in chain {
            if !dirs.contains(&d) {
                let mut h = header(tar::EntryType::Directory, 0, 0o755, mtime);
                builder.append_data(&mut h, format!("{d}/"), io::empty())?;
                dirs.push(d);
            }
        }
    }
    for &i in &layer.files {
        let f = &model.files[i];
        let mut h = header(tar::EntryType::Regular, f.size, 0o644, mtime);
        let file = std::fs::File::open(&f.path)?;
        builder.append_data(&mut h, format!("{IMAGE_MODEL_DIR}/{}", f.rel), file.take(f.size))?;
    }
    builder.into_inner()?.flush()
}

fn header(kind: tar::EntryType, size: u64, mode: u32, mtime: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h
}

/// A writer that hashes and counts what passes through it.
#[derive(Default)]
pub struct Hashing {
    hasher: Sha256,
    bytes: u64,
}

impl Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.hasher.update(buf);
        self.bytes += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Hashing {
    /// `sha256:<hex>` and the byte count.
    pub fn finish(self) -> (String, u64) {
        (
            format!("sha256:{}", hex::encode(self.hasher.finalize())),
            self.bytes,
        )
    }
}

/// The digest and size of a tar layer, from one pass over its files.
pub fn tar_layer_digest(layer: &TarLayer, model: &Model, mtime: u64) -> io::Result<(String, u64)> {
    let mut h = Hashing::default();
    write_tar_layer(layer, model, &mut h, mtime)?;
    Ok(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_layers_are_reproducible_and_unpack_to_the_files() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("m");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("config.json"), b"{}").unwrap();
        std::fs::write(root.join("sub/w.bin"), vec![7u8; 3000]).unwrap();
        let m = model(&root).unwrap();
        let layers = image_layers(&m);
        assert_eq!(layers.len(), 1, "both files are small");
        let a = tar_layer_digest(&layers[0], &m, 0).unwrap();
        // Touching the files changes nothing: no mtime or owner from disk is written.
        std::fs::write(root.join("config.json"), b"{}").unwrap();
        let b = tar_layer_digest(&layers[0], &m, 0).unwrap();
        assert_eq!(a, b);
        assert_ne!(
            a,
            tar_layer_digest(&layers[0], &m, 1).unwrap(),
            "SOURCE_DATE_EPOCH is written"
        );
        let mut bytes = Vec::new();
        write_tar_layer(&layers[0], &m, &mut bytes, 0).unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            ["models/", "models/sub/", "models/config.json", "models/sub/w.bin"]
        );
    }
}
