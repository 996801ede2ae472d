//! Who may read the external metrics: the API server's front proxy only. A request reaches the
//! operator through the aggregation layer, which has authenticated and authorized the caller (RBAC on
//! `external.metrics.k8s.io`) and then connects with its proxy client certificate — signed by the
//! CA in `kube-system/extension-apiserver-authentication` (`requestheader-client-ca-file`) and named
//! in its `requestheader-allowed-names`. The listener requires that certificate (mutual TLS) and that
//! name; nothing else in the cluster's network can read it directly.
//!
//! Invariants: no client certificate, one from another CA, or a name not allowed ends the connection
//! before a byte of HTTP is read; an empty allowed-names list means any name the CA signed (the API
//! server's own rule for `--requestheader-allowed-names`).

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use std::sync::Arc;

/// The ConfigMap the API server publishes its front proxy's CA and names in.
pub const AUTH_CONFIGMAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

/// How the front proxy is recognised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontProxy {
    /// PEM: the CA that signs the proxy's client certificate.
    pub client_ca: String,
    /// Common names allowed (empty: any the CA signed).
    pub allowed_names: Vec<String>,
}

impl FrontProxy {
    /// From the ConfigMap's data: `requestheader-client-ca-file` and `requestheader-allowed-names` (a
    /// JSON list); `Err` says what is missing (the API server runs without `--requestheader-*` flags).
    pub fn from_data(data: &std::collections::BTreeMap<String, String>) -> Result<FrontProxy, String> {
        let (ns, name) = AUTH_CONFIGMAP;
        let client_ca = data
            .get("requestheader-client-ca-file")
            .filter(|c| !c.trim().is_empty())
            .ok_or_else(|| {
                format!(
                    "{ns}/{name} has no requestheader-client-ca-file: the API server runs without the \
                     aggregation layer (--requestheader-client-ca-file, --proxy-client-cert-file)"
                )
            })?
            .clone();
        let allowed_names = match data.get("requestheader-allowed-names") {
            Some(json) if !json.trim().is_empty() => serde_json::from_str(json)
                .map_err(|e| format!("{ns}/{name}: requestheader-allowed-names: {e}"))?,
            _ => Vec::new(),
        };
        Ok(FrontProxy {
            client_ca,
            allowed_names,
        })
    }

    /// Whether a client certificate (DER) carries an allowed name.
    pub fn allows(&self, cert: &[u8]) -> bool {
        self.allowed_names.is_empty() || common_name(cert).is_some_and(|cn| self.allowed_names.contains(&cn))
    }
}

/// The TLS configuration: our certificate and key (PEM), client certificates required and checked
/// against the front proxy's CA; HTTP/1.1 only.
pub fn server_config(cert_pem: &[u8], key_pem: &[u8], proxy: &FrontProxy) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(proxy.client_ca.as_bytes()) {
        let ca = ca.map_err(|e| format!("the front proxy's CA: {e}"))?;
        roots.add(ca).map_err(|e| format!("the front proxy's CA: {e}"))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("the front proxy's CA: {e}"))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the serving certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("the serving key: {e}"))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| format!("the serving certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// One DER element: (tag, content, what follows).
fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The subject's common name of an X.509 certificate (DER), if it has one.
pub fn common_name(cert: &[u8]) -> Option<String> {
    const SEQUENCE: u8 = 0x30;
    const CN: [u8; 3] = [0x55, 0x04, 0x03];
    let (_, certificate, _) = element(cert).filter(|e| e.0 == SEQUENCE)?;
    let (_, tbs, _) = element(certificate).filter(|e| e.0 == SEQUENCE)?;
    let mut fields = tbs;
    // [0] version (optional), serial, signature, issuer, validity, subject.
    if fields.first() == Some(&0xa0) {
        fields = element(fields)?.2;
    }
    for _ in 0..4 {
        fields = element(fields)?.2;
    }
    let (_, mut subject, _) = element(fields).filter(|e| e.0 == SEQUENCE)?;
    while let Some((_, set, rest)) = element(subject) {
        let mut attributes = set;
        while let Some((_, attribute, next)) = element(attributes) {
            let (oid_tag, oid, value) = element(attribute)?;
            if oid_tag == 0x06 && oid == CN {
                let (_, text, _) = element(value)?;
                return String::from_utf8(text.to_vec()).ok();
            }
            attributes = next;
        }
        subject = rest;
    }
    None
}

#[cfg(test)]
mod tests;
