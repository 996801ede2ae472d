//! `pvc://claim[/path]`: model files on a PersistentVolumeClaim (ReadOnlyMany, or one a node shares),
//! which the operator mounts read-only into every runtime pod at the model's path (`subPath: path`).
//! Nothing is copied: `fetch --mounted DIR` checks the digest of what is mounted, and `serve` checks it
//! again at start-up, as for every source.
//!
//! Invariants: the claim is a Kubernetes object name (DNS-1123 subdomain, ≤ 253 characters); the path
//! is a safe relative path (no `..`), so a mount can never reach outside the claim.

use super::super::FetchError;

/// A claim and the model's directory (or file) on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PvcPath {
    /// The PersistentVolumeClaim's name, in the ModelDeployment's namespace.
    pub claim: String,
    /// The model's path on the volume (empty: its root).
    pub path: String,
}

impl PvcPath {
    /// Parses what follows `pvc://`.
    pub fn parse(rest: &str, invalid: impl Fn(&str) -> FetchError) -> Result<PvcPath, FetchError> {
        let (claim, path) = rest.split_once('/').unwrap_or((rest, ""));
        let path = path.trim_end_matches('/');
        if !is_dns_subdomain(claim) {
            return Err(invalid(
                "the claim must be a PersistentVolumeClaim name (lower-case letters, digits, '-' and '.', at most 253)",
            ));
        }
        if !path.is_empty() && super::safe_relative(path).is_none() {
            return Err(invalid(
                "the path on the claim must be relative, without '..' (pvc://claim/dir)",
            ));
        }
        Ok(PvcPath {
            claim: claim.to_string(),
            path: path.to_string(),
        })
    }

    /// `pvc://claim/path`.
    pub fn display(&self) -> String {
        if self.path.is_empty() {
            format!("pvc://{}", self.claim)
        } else {
            format!("pvc://{}/{}", self.claim, self.path)
        }
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<PvcPath, String> {
        PvcPath::parse(s, |w| FetchError::InvalidArgument(w.into())).map_err(|e| e.to_string())
    }

    #[test]
    fn claims_and_paths() {
        let p = parse("models/smollm2/q4").unwrap();
        assert_eq!((p.claim.as_str(), p.path.as_str()), ("models", "smollm2/q4"));
        assert_eq!(p.display(), "pvc://models/smollm2/q4");
        assert_eq!(parse("models").unwrap().display(), "pvc://models");
        assert!(parse("Models/x").unwrap_err().contains("claim"));
        assert!(parse("models/../etc").unwrap_err().contains("relative"));
        assert!(parse("").unwrap_err().contains("claim"));
    }
}
