//! Registry credentials as Kubernetes keeps them: a `kubernetes.io/dockerconfigjson` Secret (the same
//! Secret an `imagePullSecrets` entry names), mounted as a file, `{"auths": {"<registry>": {"auth":
//! base64(user:password)} | {"username", "password"} | {"identitytoken"}}}`.
//!
//! Invariants: credentials are chosen by the registry's host (and port) alone — a key written as a URL
//! (`https://host/v1/`) matches its host — and are handed only to the client talking to that registry;
//! nothing here is ever formatted into a message (errors name the file and the field, never a value).

use super::super::super::FetchError;
use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(serde::Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

#[derive(serde::Deserialize)]
struct Entry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    identitytoken: Option<String>,
}

/// The credentials of a docker config file, keyed by `host[:port]`.
#[derive(Clone, Default)]
pub struct DockerConfig {
    by_host: BTreeMap<String, (String, String)>,
}

impl std::fmt::Debug for DockerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<&String> = self.by_host.keys().collect();
        write!(f, "DockerConfig({hosts:?}, <redacted>)")
    }
}

impl DockerConfig {
    /// Reads a `.dockerconfigjson` (or `config.json`) file.
    pub fn read(path: &Path) -> Result<DockerConfig, FetchError> {
        let bytes = std::fs::read(path).map_err(FetchError::io(format!("reading {}", path.display())))?;
        Self::parse(&bytes).map_err(|why| {
            FetchError::InvalidArgument(format!("registry credentials {}: {why}", path.display()))
        })
    }

    /// Parses the JSON; the error names the field, never a value.
    pub fn parse(bytes: &[u8]) -> Result<DockerConfig, String> {
        let file: ConfigFile = serde_json::from_slice(bytes)
            .map_err(|e| format!("not a docker config file (line {})", e.line()))?;
        let mut by_host = BTreeMap::new();
        for (key, e) in file.auths {
            let pair = match (&e.auth, &e.username, &e.password, &e.identitytoken) {
                (Some(auth), _, _, _) => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .map_err(|_| format!("auths.{key}.auth is not base64"))?;
                    let text =
                        String::from_utf8(decoded).map_err(|_| format!("auths.{key}.auth is not UTF-8"))?;
                    let (u, p) = text
                        .split_once(':')
                        .ok_or_else(|| format!("auths.{key}.auth is not user:password"))?;
                    (u.to_string(), p.to_string())
                }
                (None, Some(u), Some(p), _) => (u.clone(), p.clone()),
                // An identity token is a refresh token, sent as the password of the `<token>` user.
                (None, _, _, Some(t)) => ("<token>".to_string(), t.clone()),
                _ => {
                    return Err(format!(
                        "auths.{key} has neither auth, username/password nor identitytoken"
                    ));
                }
            };
            by_host.insert(host_of(&key), pair);
        }
        Ok(DockerConfig { by_host })
    }

    /// The credentials for `registry` (`host[:port]`), or anonymous access.
    pub fn auth_for(&self, registry: &str) -> RegistryAuth {
        match self.by_host.get(registry) {
            Some((u, p)) => RegistryAuth::Basic(u.clone(), p.clone()),
            None => RegistryAuth::Anonymous,
        }
    }
}

/// `https://host:port/v1/` → `host:port`; `host` stays `host`.
fn host_of(key: &str) -> String {
    let rest = key.split_once("://").map_or(key, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_by_host() {
        let json = br#"{"auths": {
            "https://registry.example:5000/v1/": {"auth": "dXNlcjpwYXNz"},
            "other.example": {"username": "u2", "password": "p2"},
            "tok.example": {"identitytoken": "t3"}}}"#;
        let c = DockerConfig::parse(json).unwrap();
        let basic = |r: &str| match c.auth_for(r) {
            RegistryAuth::Basic(u, p) => Some((u, p)),
            _ => None,
        };
        assert_eq!(
            basic("registry.example:5000"),
            Some(("user".into(), "pass".into()))
        );
        assert_eq!(basic("other.example"), Some(("u2".into(), "p2".into())));
        assert_eq!(basic("tok.example"), Some(("<token>".into(), "t3".into())));
        assert_eq!(basic("registry.example"), None, "the port is part of the key");
        assert!(!format!("{c:?}").contains("pass"));
        let e = DockerConfig::parse(br#"{"auths": {"h": {"auth": "!!"}}}"#)
            .err()
            .unwrap();
        assert!(e.contains("auths.h.auth"), "{e}");
    }
}
