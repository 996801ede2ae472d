//! The canonical content digest of an artifact (docs/design.md, "Canonical digest").
//!
//! `sha256:` + hex SHA-256 of the UTF-8 manifest made of one line per regular file (hidden files
//! included), `<hex sha256 of file>  <path relative to the root, '/'-separated>\n`, lines sorted by path
//! bytewise. A single-file artifact is the same manifest with one line naming its file name.
//!
//! Invariants: symlinks (anywhere, including the root) and anything that is neither a regular file nor a
//! directory are refused rather than followed, so a digest always describes bytes inside the root;
//! paths must be valid UTF-8 so the manifest is well defined.

use sha2::{Digest as _, Sha256};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Why a digest could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    /// Reading the file system failed.
    #[error("{path}: {source}")]
    Io {
        /// The path being read.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A symlink was found; artifacts must be plain files so the digest covers exactly what is served.
    #[error("{0}: symlinks are refused in artifacts")]
    Symlink(PathBuf),
    /// A socket, device or FIFO was found.
    #[error("{0}: not a regular file or directory")]
    NotRegular(PathBuf),
    /// A file name is not valid UTF-8.
    #[error("{0}: path is not valid UTF-8")]
    NonUtf8(PathBuf),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DigestError + '_ {
    move |source| DigestError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Hex SHA-256 of one file's bytes, streamed.
pub fn sha256_file(path: &Path) -> Result<String, DigestError> {
    let mut file = fs::File::open(path).map_err(io_err(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// The manifest lines `(relative path, hex sha256)` of an artifact, sorted by path bytes.
pub fn manifest(root: &Path) -> Result<Vec<(String, String)>, DigestError> {
    let meta = fs::symlink_metadata(root).map_err(io_err(root))?;
    let mut entries = Vec::new();
    if meta.file_type().is_symlink() {
        return Err(DigestError::Symlink(root.to_path_buf()));
    } else if meta.is_file() {
        let name = root
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| DigestError::NonUtf8(root.to_path_buf()))?;
        entries.push((name.to_string(), sha256_file(root)?));
    } else if meta.is_dir() {
        walk(root, "", &mut entries)?;
    } else {
        return Err(DigestError::NotRegular(root.to_path_buf()));
    }
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(entries)
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, String)>) -> Result<(), DigestError> {
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        let name = entry
            .file_name()
            .into_string()
            .map_err(|_| DigestError::NonUtf8(path.clone()))?;
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let ft = entry.file_type().map_err(io_err(&path))?;
        if ft.is_symlink() {
            return Err(DigestError::Symlink(path));
        } else if ft.is_dir() {
            walk(&path, &rel, out)?;
        } else if ft.is_file() {
            out.push((rel, sha256_file(&path)?));
        } else {
            return Err(DigestError::NotRegular(path));
        }
    }
    Ok(())
}

/// The manifest's text: one `<hex>  <path>\n` line per file.
pub fn manifest_text(lines: &[(String, String)]) -> String {
    lines
        .iter()
        .map(|(path, hex)| format!("{hex}  {path}\n"))
        .collect()
}

/// The canonical digest `sha256:<hex>` of manifest lines (sorted, as [`manifest`] gives them).
pub fn digest_of_manifest(lines: &[(String, String)]) -> String {
    let text = manifest_text(lines);
    format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())))
}

/// The canonical digest `sha256:<hex>` of a directory or a single file.
pub fn digest_path(root: &Path) -> Result<String, DigestError> {
    Ok(digest_of_manifest(&manifest(root)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, bytes: &[u8]) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }

    /// The fixed test vector of docs/design.md: a small tree and its expected digest. The expected value was
    /// computed independently with coreutils: `(cd tree && find . -type f | sed 's|^./||' | LC_ALL=C sort |
    /// while read f; do printf '%s  %s\n' "$(sha256sum "$f" | cut -d' ' -f1)" "$f"; done) | sha256sum`.
    #[test]
    fn test_vector_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "config.json", b"{\"hidden_size\": 64}\n");
        write(root, "tokenizer.json", b"{}");
        write(root, ".hidden", b"dot files count too\n");
        write(root, "sub/dir/b.bin", &[0u8, 1, 2, 255]);
        write(root, "sub/a.txt", b"");
        write(root, "Z-upper.txt", b"bytewise order puts Z before a\n");
        let lines = manifest(root).unwrap();
        let order: Vec<&str> = lines.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            order,
            [
                ".hidden",
                "Z-upper.txt",
                "config.json",
                "sub/a.txt",
                "sub/dir/b.bin",
                "tokenizer.json"
            ]
        );
        assert_eq!(
            digest_path(root).unwrap(),
            "sha256:50e66c2eb5e44e2372f9380707db4afd66c8f93b9eb406307fef32f583f80fb6"
        );
    }

    #[test]
    fn single_file_is_a_one_line_manifest() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "model.gguf", b"GGUF");
        let file = dir.path().join("model.gguf");
        let expected_manifest = format!("{}  model.gguf\n", hex::encode(Sha256::digest(b"GGUF")));
        assert_eq!(manifest_text(&manifest(&file).unwrap()), expected_manifest);
        // A directory holding only that file has the same digest as the file itself.
        assert_eq!(digest_path(&file).unwrap(), digest_path(dir.path()).unwrap());
    }

    #[test]
    fn one_flipped_byte_changes_the_digest() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "w.bin", &[1, 2, 3]);
        let before = digest_path(dir.path()).unwrap();
        write(dir.path(), "w.bin", &[1, 2, 2]);
        assert_ne!(before, digest_path(dir.path()).unwrap());
    }

    #[test]
    fn symlinks_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "real", b"x");
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
        let err = digest_path(dir.path()).unwrap_err();
        assert!(matches!(err, DigestError::Symlink(_)), "{err}");
        assert!(matches!(
            digest_path(&dir.path().join("link")),
            Err(DigestError::Symlink(_))
        ));
    }

    #[test]
    fn missing_path_names_the_path() {
        let err = digest_path(Path::new("/nonexistent/modelfleet")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/modelfleet"), "{err}");
    }
}
