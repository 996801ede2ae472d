//! What a caller asks for when loading an adapter (`POST /v1/adapters`, or one entry of the start-up
//! `--adapters-file`), and the runtime's policy on where adapters may come from.
//!
//! Invariants: a spec is checked field by field before anything is fetched (each refusal names the
//! field and the limit); `file://` sources must resolve — symlinks and `..` followed — under one of
//! the configured roots, so no caller can make the runtime read an arbitrary path, and the source the
//! fetch then reads is that resolved path (resolved once: a symlink swapped in after the check is not
//! followed — the copy refuses symlinks); the schemes allowed are the runtime's choice
//! (`--adapter-uri-schemes`), never the caller's.

use crate::api::error::{ApiError, ApiErrorKind};
use crate::fetch::{Source, validate_digest};
use std::path::PathBuf;

/// Most tenants one adapter may list.
pub const MAX_TENANTS: usize = 256;

pub use crate::api::adapters::AdapterSpec;

/// Where adapters may come from (`--adapter-uri-schemes`, `--adapter-file-roots`).
#[derive(Clone, Debug)]
pub struct UriPolicy {
    /// Allowed schemes among `file`, `http`, `https`, `hf`.
    pub schemes: Vec<String>,
    /// Directories `file://` sources must lie under (none: `file://` is refused).
    pub file_roots: Vec<PathBuf>,
}

fn invalid(param: &str, message: String) -> ApiError {
    ApiError {
        code: Some("invalid_request".into()),
        ..ApiError::invalid(param, message)
    }
}

fn is_served_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._/:-".contains(c))
}

/// The runtime's checks of an [`AdapterSpec`] (the type is shared with the operator, the checks are
/// the runtime's).
pub trait CheckedSpec {
    /// Checks every field, and the source against `policy`; returns the source to read (for
    /// `file://`, the resolved path that was checked).
    fn validate(&self, base_name: &str, policy: &UriPolicy) -> Result<Source, ApiError>;
}

impl CheckedSpec for AdapterSpec {
    fn validate(&self, base_name: &str, policy: &UriPolicy) -> Result<Source, ApiError> {
        if !is_served_name(&self.name) {
            return Err(invalid(
                "name",
                format!(
                    "`name` must be 1-128 characters of letters, digits and ._/:- starting with a letter or digit, got {:?}",
                    self.name
                ),
            ));
        }
        if self.name == base_name {
            return Err(invalid(
                "name",
                format!("`name` {:?} is the base model's served name", self.name),
            ));
        }
        validate_digest(&self.digest).map_err(|_| {
            invalid(
                "digest",
                format!(
                    "`digest` must be sha256: followed by 64 lower-case hex digits, got {:?}",
                    self.digest
                ),
            )
        })?;
        if self.tenants.len() > MAX_TENANTS {
            return Err(invalid(
                "tenants",
                format!(
                    "`tenants` lists {} tenants; the limit is {MAX_TENANTS}",
                    self.tenants.len()
                ),
            ));
        }
        if let Some(t) = self.tenants.iter().find(|t| t.is_empty() || t.len() > 253) {
            return Err(invalid(
                "tenants",
                format!("tenant ids must be 1-253 characters, got {t:?}"),
            ));
        }
        if self.uri.is_empty() || self.uri.len() > 2048 {
            return Err(invalid("uri", "`uri` must be 1-2048 characters".into()));
        }
        let source = Source::parse(&self.uri).map_err(|e| invalid("uri", e.to_string()))?;
        policy.resolve(source)
    }
}

impl UriPolicy {
    fn refuse(message: String) -> ApiError {
        ApiError {
            param: Some("uri".into()),
            code: Some("uri_not_allowed".into()),
            ..ApiError::new(ApiErrorKind::PermissionDenied, message)
        }
    }

    /// Refuses sources this runtime may not read; a `file://` source comes back as the resolved path
    /// that was checked, which is the one to read.
    pub fn resolve(&self, source: Source) -> Result<Source, ApiError> {
        let scheme = source.scheme();
        if !self.schemes.iter().any(|s| s == scheme) {
            return Err(Self::refuse(format!(
                "`{scheme}` adapter URIs are not allowed by this runtime (allowed: {})",
                self.schemes.join(", ")
            )));
        }
        if let Source::File(path) = &source {
            if self.file_roots.is_empty() {
                return Err(Self::refuse(
                    "file:// adapter URIs need --adapter-file-roots, and none is configured".into(),
                ));
            }
            // Resolve symlinks and `..` before comparing; a path that does not exist is refused here
            // too (rather than later, as an unavailable source) so nothing about other paths leaks.
            let real = path.canonicalize().map_err(|_| {
                Self::refuse(format!(
                    "{} is not under an allowed adapter root or does not exist",
                    path.display()
                ))
            })?;
            let allowed = self
                .file_roots
                .iter()
                .filter_map(|r| r.canonicalize().ok())
                .any(|root| real.starts_with(&root));
            if !allowed {
                return Err(Self::refuse(format!(
                    "{} is not under an allowed adapter root or does not exist",
                    path.display()
                )));
            }
            return Ok(Source::File(real));
        }
        Ok(source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, uri: &str) -> AdapterSpec {
        AdapterSpec {
            name: name.into(),
            uri: uri.into(),
            digest: format!("sha256:{}", "a".repeat(64)),
            tenants: vec![],
        }
    }

    #[test]
    fn fields_are_checked_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let policy = UriPolicy {
            schemes: vec!["file".into(), "https".into()],
            file_roots: vec![dir.path().to_path_buf()],
        };
        let uri = format!("file://{}", dir.path().display());
        assert!(spec("sql-lora", &uri).validate("base", &policy).is_ok());
        // The source to read is the path that was checked, resolved once.
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
        let via_link = format!("file://{}/link/../link", dir.path().display());
        assert_eq!(
            spec("x", &via_link).validate("base", &policy).unwrap(),
            Source::File(dir.path().join("real").canonicalize().unwrap())
        );
        let param = |s: AdapterSpec| s.validate("base", &policy).unwrap_err().param.unwrap();
        assert_eq!(param(spec("", &uri)), "name");
        assert_eq!(param(spec("base", &uri)), "name");
        assert_eq!(param(spec("a b", &uri)), "name");
        let mut bad = spec("x", &uri);
        bad.digest = "sha256:XYZ".into();
        assert_eq!(param(bad), "digest");
        let mut bad = spec("x", &uri);
        bad.tenants = vec![String::new()];
        assert_eq!(param(bad), "tenants");
        assert_eq!(param(spec("x", "ftp://h/x")), "uri");
    }

    #[test]
    fn sources_outside_the_policy_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("a")).unwrap();
        std::os::unix::fs::symlink(other.path(), root.path().join("escape")).unwrap();
        let policy = UriPolicy {
            schemes: vec!["file".into(), "hf".into()],
            file_roots: vec![root.path().to_path_buf()],
        };
        let code = |uri: String| {
            let e = spec("x", &uri).validate("base", &policy).unwrap_err();
            (e.status(), e.code.unwrap())
        };
        let denied = (403, "uri_not_allowed".to_string());
        assert!(
            spec("x", &format!("file://{}/a", root.path().display()))
                .validate("b", &policy)
                .is_ok()
        );
        assert_eq!(code(format!("file://{}", other.path().display())), denied);
        assert_eq!(code(format!("file://{}/a/../../", root.path().display())), denied);
        assert_eq!(code(format!("file://{}/escape", root.path().display())), denied);
        assert_eq!(code("file:///etc".into()), denied);
        assert_eq!(
            code("https://example.invalid/x.bin".into()),
            denied,
            "https not allowed"
        );
        let none = UriPolicy {
            schemes: vec!["file".into()],
            file_roots: vec![],
        };
        let e = spec("x", &format!("file://{}/a", root.path().display()))
            .validate("b", &none)
            .unwrap_err();
        assert!(e.message.contains("--adapter-file-roots"), "{}", e.message);
    }
}
