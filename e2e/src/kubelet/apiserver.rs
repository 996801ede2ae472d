//! How pods reach the real API server: its URL, its CA, and the kubeconfig each pod gets.
//!
//! Processes cannot read `/var/run/secrets/kubernetes.io/serviceaccount`, so each pod gets a
//! kubeconfig (in `KUBECONFIG`) that names the API server, its CA and a `tokenFile` holding a
//! TokenRequest token of the pod's ServiceAccount; kube-rs and kubectl re-read `tokenFile`, so
//! the kubelet refreshes the token by rewriting that file. Invariant: the server and CA are the
//! ones of the kubelet's own kubeconfig unless `--apiserver-url` / `--ca-file` override them.

use std::path::{Path, PathBuf};

use kube::config::Kubeconfig;
use serde_json::json;

use super::error::{Error, Result};

/// Where the API server is and how to trust it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiAccess {
    /// `https://host:port`.
    pub server: String,
    /// Host part of `server` (for `KUBERNETES_SERVICE_HOST`).
    pub host: String,
    /// Port part of `server` (for `KUBERNETES_SERVICE_PORT`).
    pub port: u16,
    /// How the pod's kubeconfig names the CA.
    pub ca: CaSource,
}

/// The API server's CA as written into pods' kubeconfigs.
#[derive(Debug, Clone, PartialEq)]
pub enum CaSource {
    /// Base64 PEM, copied verbatim from the kubelet's kubeconfig.
    Data(String),
    /// A CA file on the host.
    File(PathBuf),
    /// The kubelet's kubeconfig trusts nothing in particular (insecure or system roots).
    None,
}

impl ApiAccess {
    /// Derives the access from the kubelet's kubeconfig (current context), with overrides.
    pub fn from_kubeconfig(kc: &Kubeconfig, server: Option<&str>, ca_file: Option<&Path>) -> Result<Self> {
        let context_name = kc.current_context.clone().unwrap_or_default();
        let cluster_name = kc
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.clone())
            .or_else(|| kc.clusters.first().map(|c| c.name.clone()))
            .ok_or_else(|| Error::Config("the kubeconfig has no cluster".into()))?;
        let cluster = kc
            .clusters
            .iter()
            .find(|c| c.name == cluster_name)
            .and_then(|c| c.cluster.clone())
            .ok_or_else(|| Error::Config(format!("the kubeconfig has no cluster {cluster_name:?}")))?;
        let server = server
            .map(str::to_string)
            .or(cluster.server)
            .ok_or_else(|| Error::Config("the kubeconfig's cluster has no server".into()))?;
        let ca = match (
            ca_file,
            cluster.certificate_authority_data,
            cluster.certificate_authority,
        ) {
            (Some(file), _, _) => CaSource::File(file.to_path_buf()),
            (None, Some(data), _) => CaSource::Data(data),
            (None, None, Some(file)) => CaSource::File(PathBuf::from(file)),
            (None, None, None) => CaSource::None,
        };
        let (host, port) = split_server(&server)?;
        Ok(ApiAccess {
            server,
            host,
            port,
            ca,
        })
    }

    /// The kubeconfig YAML of a pod: this server and CA, a token read from `token_file`, and the
    /// pod's namespace as the default namespace.
    pub fn pod_kubeconfig(&self, token_file: &Path, namespace: &str) -> String {
        let mut cluster = json!({ "server": self.server });
        match &self.ca {
            CaSource::Data(data) => cluster["certificate-authority-data"] = json!(data),
            CaSource::File(path) => cluster["certificate-authority"] = json!(path.to_string_lossy()),
            CaSource::None => {}
        }
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "mf-cluster", "cluster": cluster }],
            "users": [{ "name": "pod", "user": { "tokenFile": token_file.to_string_lossy() } }],
            "contexts": [{
                "name": "pod",
                "context": { "cluster": "mf-cluster", "user": "pod", "namespace": namespace },
            }],
            "current-context": "pod",
        });
        serde_saphyr::to_string(&config).unwrap_or_else(|_| config.to_string())
    }
}

/// Splits `scheme://host:port/...` into host and port (443 for https, 80 for http by default).
pub fn split_server(server: &str) -> Result<(String, u16)> {
    let bad = || Error::Config(format!("API server URL {server:?} is not scheme://host[:port]"));
    let (scheme, rest) = server.split_once("://").ok_or_else(bad)?;
    let authority = rest.split('/').next().unwrap_or_default();
    let default_port = if scheme == "http" { 80 } else { 443 };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        (host.to_string(), after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    let port = port
        .map(|p| p.parse::<u16>().map_err(|_| bad()))
        .transpose()?
        .unwrap_or(default_port);
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(server: &str, expected: Option<(&str, u16)>) {
        let got = split_server(server).ok();
        assert_eq!(got, expected.map(|(h, p)| (h.to_string(), p)), "{server}");
    }

    #[test]
    fn servers_split_into_host_and_port() {
        check("https://127.0.0.1:6443", Some(("127.0.0.1", 6443)));
        check("https://127.0.0.1:16443/", Some(("127.0.0.1", 16443)));
        check("https://api.example", Some(("api.example", 443)));
        check("http://localhost/prefix", Some(("localhost", 80)));
        check("https://[::1]:6443", Some(("::1", 6443)));
        check("127.0.0.1:6443", None);
        check("https://:6443", None);
        check("https://h:x", None);
    }

    #[test]
    fn kubeconfig_gives_access_and_pod_kubeconfig_round_trips() {
        let kc = Kubeconfig::from_yaml(
            r#"
apiVersion: v1
kind: Config
current-context: a
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: QUJD
contexts:
- name: a
  context: {cluster: c, user: u}
users:
- name: u
  user: {token: t}
"#,
        )
        .unwrap();
        let access = ApiAccess::from_kubeconfig(&kc, None, None).unwrap();
        assert_eq!(access.host, "127.0.0.1");
        assert_eq!(access.port, 6443);
        assert_eq!(access.ca, CaSource::Data("QUJD".into()));
        let over = ApiAccess::from_kubeconfig(&kc, Some("https://10.0.0.1:7443"), Some(Path::new("/ca.crt")))
            .unwrap();
        assert_eq!((over.host.as_str(), over.port), ("10.0.0.1", 7443));
        assert_eq!(over.ca, CaSource::File("/ca.crt".into()));

        let text = access.pod_kubeconfig(Path::new("/pods/p/token"), "team-a");
        let parsed = Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(parsed.current_context.as_deref(), Some("pod"));
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("QUJD"));
        let user = parsed.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.token_file.as_deref(), Some("/pods/p/token"));
        let ctx = parsed.contexts[0].context.as_ref().unwrap();
        assert_eq!(ctx.namespace.as_deref(), Some("team-a"));
    }
}
