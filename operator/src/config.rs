//! Operator-wide settings (flags of `modelfleet-operator run`, each also from `MODELFLEET_<FLAG>`).

use std::path::PathBuf;

/// Where runtime pods keep the digest-keyed model cache (`fetch --cache`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelCache {
    /// A host directory shared by the pods of a node (survives pod restarts and scale-ups).
    HostPath(PathBuf),
    /// A PersistentVolumeClaim (ReadWriteMany when pods land on several nodes).
    Pvc(String),
    /// No cache: every pod downloads the model.
    None,
}

/// A set of namespaces from a flag: which namespaces' pods mount the shared model cache
/// (`--model-cache-namespaces`) or the node file roots (`--node-file-namespaces`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NamespaceSet {
    /// None: every pod fetches into its own volume (the default).
    #[default]
    None,
    /// These namespaces; an entry ending in `*` names every namespace starting with what precedes it.
    Listed(Vec<String>),
    /// Every namespace (`*`).
    All,
}

impl NamespaceSet {
    /// From the flag's comma-separated values (`*` alone means every namespace).
    pub fn parse(values: &[String]) -> NamespaceSet {
        let listed: Vec<String> = values
            .iter()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        if listed.iter().any(|v| v == "*") {
            NamespaceSet::All
        } else if listed.is_empty() {
            NamespaceSet::None
        } else {
            NamespaceSet::Listed(listed)
        }
    }

    /// Whether `ns` is in the set.
    pub fn includes(&self, ns: &str) -> bool {
        match self {
            NamespaceSet::None => false,
            NamespaceSet::Listed(l) => l.iter().any(|n| match n.strip_suffix('*') {
                Some(prefix) => ns.starts_with(prefix),
                None => n == ns,
            }),
            NamespaceSet::All => true,
        }
    }
}

/// Where the fleet gateway's pods are: their pending requests scale deployments from zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayPods {
    /// Namespace of the gateway's pods.
    pub namespace: String,
    /// Label selector of the gateway's pods.
    pub selector: String,
    /// Port of their `/metrics`.
    pub metrics_port: u16,
}

impl Default for GatewayPods {
    fn default() -> Self {
        GatewayPods {
            namespace: "modelfleet-system".into(),
            selector: "app.kubernetes.io/name=modelfleet-gateway".into(),
            metrics_port: 8081,
        }
    }
}

/// Which ModelDeployments must not claim one served name (they would be behind one gateway).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ServedNameScope {
    /// Any two the operator sees (one gateway serves them all).
    #[default]
    Cluster,
    /// Two in one namespace (a gateway per namespace).
    Namespace,
}

/// Settings every builder reads.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// Image of `modelfleet-runtime` when a ModelDeployment does not name one.
    pub runtime_image: String,
    /// `imagePullPolicy` of runtime containers; `None`: Kubernetes' default.
    pub runtime_image_pull_policy: Option<String>,
    /// Secrets runtime pods pull their image with (`imagePullSecrets`, in the pod's namespace).
    pub image_pull_secrets: Vec<String>,
    /// The shared model cache of runtime pods.
    pub model_cache: ModelCache,
    /// Namespaces whose pods mount `model_cache`; the others fetch into their own volume only (a
    /// shared host directory is a channel between namespaces, so it is opt-in).
    pub model_cache_namespaces: NamespaceSet,
    /// `sizeLimit` of each pod's model volume (a Kubernetes quantity), also passed to `fetch --max-bytes`.
    pub model_volume_size_limit: Option<String>,
    /// `sizeLimit` of each pod's adapter store (a quantity), also passed to `serve --max-adapter-bytes`.
    pub adapter_store_size_limit: Option<String>,
    /// Seconds a runtime pod gets to drain in-flight requests on SIGTERM.
    pub termination_grace_seconds: i64,
    /// Seconds a terminating runtime pod keeps serving before SIGTERM (`preStop` sleep), so load
    /// balancers and gateways stop sending to it first. 0: none.
    pub pre_stop_seconds: i64,
    /// User and group id runtime containers run as (non-root).
    pub run_as_user: i64,
    /// Directories under which runtime pods may read `file://` adapters (`--adapter-file-roots`). The
    /// cluster admin's choice, never a namespace user's: empty means no `file://` adapters at all.
    pub adapter_file_roots: Vec<String>,
    /// Node directories mounted read-only, at the same path, into every runtime pod's fetch and runtime
    /// containers (`--node-file-roots`): where `file://` models and adapters are read from on a node.
    /// Each is a hostPath volume, so pods that mount one are not admitted under the baseline or
    /// restricted Pod Security Standards; empty (the default) mounts nothing.
    pub node_file_roots: Vec<String>,
    /// Namespaces whose runtime pods mount the node file roots (`--node-file-namespaces`).
    pub node_file_namespaces: NamespaceSet,
    /// The fleet gateway's pods.
    pub gateway: GatewayPods,
    /// Where a served name must be unique.
    pub served_name_scope: ServedNameScope,
    /// Pod settings every runtime pod gets beneath its ModelDeployment's (`--runtime-pod-defaults`,
    /// the chart's `runtime.podDefaults`): a node pool's selector and toleration, a priority class, a
    /// CA bundle volume.
    pub pod_defaults: modelfleet_crds::placement::PodSettings,
    /// Where runtime pods export their traces (the operator's own `--otlp-traces-endpoint`): `None`,
    /// they do not trace.
    pub tracing: Option<RuntimeTracing>,
}

/// The trace export every runtime pod gets (docs/operations.md, "Traces").
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeTracing {
    /// The collector's OTLP/HTTP URL.
    pub endpoint: String,
    /// The share of new traces sampled; `None`: the runtime's default (all).
    pub sample_ratio: Option<f64>,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            runtime_image: "registry.example/modelfleet/runtime:0.1.0".into(),
            runtime_image_pull_policy: None,
            image_pull_secrets: Vec::new(),
            model_cache: ModelCache::HostPath("/var/lib/modelfleet/cache".into()),
            model_cache_namespaces: NamespaceSet::None,
            model_volume_size_limit: None,
            adapter_store_size_limit: Some("2Gi".into()),
            termination_grace_seconds: 60,
            pre_stop_seconds: 5,
            run_as_user: 65532,
            adapter_file_roots: Vec::new(),
            node_file_roots: Vec::new(),
            node_file_namespaces: NamespaceSet::All,
            gateway: GatewayPods::default(),
            served_name_scope: ServedNameScope::Cluster,
            pod_defaults: Default::default(),
            tracing: None,
        }
    }
}

/// Bytes of a Kubernetes quantity (`20Gi`, `500M`, `1e9`, `123`); `None` if it is not one we read
/// (fractions and milli-units make no sense for bytes).
pub fn quantity_bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let factor: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        s if s.starts_with(['e', 'E']) => 10u64.checked_pow(s[1..].parse().ok()?)?,
        _ => return None,
    };
    let n: u64 = number.parse().ok()?;
    n.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_bytes() {
        let cases = [
            ("20Gi", Some(20u64 << 30)),
            ("512Mi", Some(512 << 20)),
            ("1G", Some(1_000_000_000)),
            ("123", Some(123)),
            ("1e3", Some(1000)),
            ("1.5Gi", None),
            ("100m", None),
            ("", None),
            ("Gi", None),
        ];
        for (q, want) in cases {
            assert_eq!(quantity_bytes(q), want, "{q}");
        }
    }

    #[test]
    fn cache_namespaces() {
        let parse = |v: &[&str]| NamespaceSet::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(parse(&[]), NamespaceSet::None);
        assert!(!parse(&[]).includes("a"));
        assert!(parse(&["a", " b "]).includes("b") && !parse(&["a"]).includes("c"));
        assert!(parse(&["*"]).includes("anything"));
    }
}
