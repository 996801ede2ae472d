//! How sources are reached: endpoints, extra trust roots and credentials, gathered once per fetch from
//! flags, the environment and a mounted credentials directory (`fetch --credentials-dir`, the
//! Secret `spec.model.credentialsSecretRef` names).
//!
//! Invariants: every secret here is redacted from `Debug`, so logging a request never shows one; each
//! credential is used only by the source it belongs to (the Hub token only toward the Hub endpoint's
//! origin, registry credentials only toward their registry).

use super::source::oci::auth::DockerConfig;
use super::source::s3::S3Access;
use std::fmt;
use std::path::PathBuf;

/// Endpoints, trust and credentials for every source.
#[derive(Clone)]
pub struct Access {
    /// Hugging Face Hub endpoint for `hf://` URIs.
    pub hf_endpoint: String,
    /// Bearer token for the Hub (`HF_TOKEN`), sent only to `hf_endpoint`'s origin.
    pub hf_token: Option<String>,
    /// PEM certificates trusted for https besides the system's roots (a private mirror's CA).
    pub ca_file: Option<PathBuf>,
    /// Speak plain HTTP to the `oci://` URI's registry (a registry inside the cluster without TLS).
    pub registry_plain_http: bool,
    /// Registry credentials (a docker config: the Secret an `imagePullSecrets` entry would name).
    pub registry_auth: Option<DockerConfig>,
    /// S3 endpoint, region, addressing and keys.
    pub s3: S3Access,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            hf_endpoint: "https://huggingface.co".into(),
            hf_token: None,
            ca_file: None,
            registry_plain_http: false,
            registry_auth: None,
            s3: S3Access::default(),
        }
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("hf_endpoint", &self.hf_endpoint)
            .field("hf_token", &self.hf_token.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .field("registry_plain_http", &self.registry_plain_http)
            .field("registry_auth", &self.registry_auth)
            .field("s3", &self.s3)
            .finish()
    }
}
