//! The registry client: `oci_client` configured from [`Access`] — plain HTTP only for the registries
//! the deployment names as such, the extra CA, timeouts — with the registry's credentials stored for
//! its host only; and the one mapping from the client's errors to [`FetchError`].
//!
//! Invariants: a token or password never leaves for another host (the client keeps credentials per
//! registry, and blob `urls` pointing elsewhere are dropped before a pull: see `blobs.rs`); an answer
//! of 401/403 is `Unauthorized`, never retried; a 404 is `SourceUnavailable` naming what was missing.

use super::super::super::{Access, FetchError};
use super::reference::OciRef;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use std::time::Duration;

/// A client for pulling from `r.registry`, with its credentials stored.
pub async fn connect(access: &Access, r: &OciRef) -> Result<oci_client::Client, FetchError> {
    connect_with(access, r, false).await
}

/// A client for pushing to `r.registry`: blobs go up in one request each (their size is known).
pub async fn connect_for_push(access: &Access, r: &OciRef) -> Result<oci_client::Client, FetchError> {
    connect_with(access, r, true).await
}

async fn connect_with(access: &Access, r: &OciRef, push: bool) -> Result<oci_client::Client, FetchError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = ClientConfig {
        protocol: if access.registry_plain_http {
            ClientProtocol::HttpsExcept(vec![r.registry.clone()])
        } else {
            ClientProtocol::Https
        },
        read_timeout: Some(Duration::from_secs(60)),
        connect_timeout: Some(Duration::from_secs(10)),
        user_agent: concat!("modelfleet-runtime/", env!("CARGO_PKG_VERSION")),
        // An index is resolved by hand (see manifest.rs), never by the client's guess.
        platform_resolver: None,
        use_monolithic_push: push,
        ..Default::default()
    };
    if let Some(path) = &access.ca_file {
        let pem = std::fs::read(path).map_err(FetchError::io(format!("--ca-file {}", path.display())))?;
        config.extra_root_certificates.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data: pem,
        });
    }
    let client = oci_client::Client::new(config);
    let auth = match &access.registry_auth {
        Some(cfg) => cfg.auth_for(&r.registry),
        None => RegistryAuth::Anonymous,
    };
    client.store_auth_if_needed(&r.registry, &auth).await;
    Ok(client)
}

/// The auth the client stored for `r` (the calls that take one explicitly).
pub fn auth_for(access: &Access, r: &OciRef) -> RegistryAuth {
    match &access.registry_auth {
        Some(cfg) => cfg.auth_for(&r.registry),
        None => RegistryAuth::Anonymous,
    }
}

/// Maps a client error about `what` (e.g. "manifest sha256:…") of `shown` to a fetch error.
pub fn error(e: OciDistributionError, shown: &str, what: &str) -> FetchError {
    use OciDistributionError as E;
    match &e {
        E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => FetchError::Unauthorized(format!(
            "{shown}: the registry refused the credentials for {what} (check credentialsSecretRef)"
        )),
        E::ServerError { code: 401 | 403, .. } => FetchError::Unauthorized(format!(
            "{shown}: the registry refused the credentials for {what} (check credentialsSecretRef)"
        )),
        E::ImageManifestNotFoundError(_) | E::ServerError { code: 404, .. } => {
            FetchError::SourceUnavailable(format!("{shown}: {what} not found in the registry"))
        }
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|x| {
                matches!(
                    x.code,
                    oci_client::errors::OciErrorCode::Unauthorized | oci_client::errors::OciErrorCode::Denied
                )
            }) =>
        {
            FetchError::Unauthorized(format!(
                "{shown}: the registry refused the credentials for {what} (check credentialsSecretRef)"
            ))
        }
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|x| {
                matches!(
                    x.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::BlobUnknown
                        | oci_client::errors::OciErrorCode::NameUnknown
                )
            }) =>
        {
            FetchError::SourceUnavailable(format!("{shown}: {what} not found in the registry"))
        }
        _ => FetchError::SourceUnavailable(format!("{shown}: {what}: {}", one_line(&e))),
    }
}

/// An error and its sources on one line.
fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s.replace('\n', " ")
}
