//! `oci://registry[:port]/repository[:tag]@sha256:<64 hex>`: an OCI artifact pinned by its manifest
//! digest. The registry is always the first path segment (no Docker Hub default: a model's home is
//! named), a tag may stand beside the digest for people to read, and the digest is what is fetched.
//!
//! Invariants: a reference without a manifest digest is refused (a tag can move; the fleet pins
//! bytes); every part is checked against the distribution spec's grammar before it goes into a URL.

use super::super::super::FetchError;

/// A parsed `oci://` reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciRef {
    /// `host[:port]`.
    pub registry: String,
    /// `path/to/repo` (lower-case path components).
    pub repository: String,
    /// The tag, if one was written (informational).
    pub tag: Option<String>,
    /// `sha256:<64 hex>`: the manifest that is fetched.
    pub manifest_digest: String,
}

impl OciRef {
    /// Parses what follows `oci://`.
    pub fn parse(rest: &str, invalid: impl Fn(&str) -> FetchError) -> Result<OciRef, FetchError> {
        let Some((name, digest)) = rest.split_once('@') else {
            return Err(invalid(
                "an oci:// URI must pin the manifest digest: oci://registry/repository[:tag]@sha256:<64 hex> \
                 (a tag alone can move)",
            ));
        };
        if super::super::super::validate_digest(digest).is_err() {
            return Err(invalid(
                "the manifest digest must be sha256: followed by 64 lower-case hex digits",
            ));
        }
        let Some((registry, path)) = name.split_once('/') else {
            return Err(invalid("expected oci://registry/repository@sha256:…"));
        };
        if !valid_registry(registry) {
            return Err(invalid(
                "the registry must be a host name or address, with an optional :port",
            ));
        }
        // A tag is after the last ':' of the last path segment (a port's ':' is in the registry).
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag)),
            _ => (path, None),
        };
        if !valid_repository(repository) {
            return Err(invalid(
                "the repository must be lower-case path components of letters, digits and . _ - separators",
            ));
        }
        if let Some(t) = tag
            && !valid_tag(t)
        {
            return Err(invalid(
                "a tag is 1-128 characters of letters, digits, _ . and - (not first)",
            ));
        }
        Ok(OciRef {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            manifest_digest: digest.to_string(),
        })
    }

    /// `oci://registry/repository[:tag]@digest`.
    pub fn display(&self) -> String {
        match &self.tag {
            Some(t) => format!(
                "oci://{}/{}:{t}@{}",
                self.registry, self.repository, self.manifest_digest
            ),
            None => format!(
                "oci://{}/{}@{}",
                self.registry, self.repository, self.manifest_digest
            ),
        }
    }

    /// The reference by digest, as `oci_client` takes it.
    pub fn client_ref(&self) -> oci_client::Reference {
        oci_client::Reference::with_digest(
            self.registry.clone(),
            self.repository.clone(),
            self.manifest_digest.clone(),
        )
    }

    /// The same repository at another manifest digest (an index's platform entry).
    pub fn at(&self, digest: &str) -> OciRef {
        OciRef {
            manifest_digest: digest.to_string(),
            ..self.clone()
        }
    }

    /// `registry/repository@digest`: what an image volume's `reference` says.
    pub fn image_reference(&self) -> String {
        format!("{}/{}@{}", self.registry, self.repository, self.manifest_digest)
    }
}

fn valid_registry(r: &str) -> bool {
    let (host, port) = match r.rsplit_once(':') {
        Some((h, p)) if !h.contains(']') || h.ends_with(']') => (h, Some(p)),
        _ => (r, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.[]:".contains(&b));
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

fn valid_repository(repo: &str) -> bool {
    !repo.is_empty()
        && repo.len() <= 255
        && repo.split('/').all(|c| {
            let b = c.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_lowercase() | b[0].is_ascii_digit()
                && b[b.len() - 1].is_ascii_lowercase() | b[b.len() - 1].is_ascii_digit()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
        })
}

fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    fn parse(s: &str) -> Result<OciRef, String> {
        OciRef::parse(s, |why| FetchError::InvalidArgument(why.to_string())).map_err(|e| e.to_string())
    }

    #[test]
    fn references() {
        let r = parse(&format!("registry.example:5000/models/smollm2:v1@{D}")).unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("registry.example:5000", "models/smollm2", Some("v1"))
        );
        assert_eq!(
            r.display(),
            format!("oci://registry.example:5000/models/smollm2:v1@{D}")
        );
        assert_eq!(
            r.image_reference(),
            format!("registry.example:5000/models/smollm2@{D}")
        );
        let r = parse(&format!("10.210.0.1:5000/m@{D}")).unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag),
            ("10.210.0.1:5000", "m", None)
        );
        for (bad, why) in [
            ("reg/m:v1", "must pin the manifest digest"),
            ("reg/m@sha256:abc", "64 lower-case hex"),
            (&format!("m@{D}") as &str, "expected oci://registry/repository"),
            (&format!("reg/Models@{D}"), "lower-case"),
            (&format!("reg/m/../x@{D}"), "lower-case"),
            (&format!("reg/m:-x@{D}"), "tag"),
            (&format!("re g/m@{D}"), "registry"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
