//! The Node: registration, status heartbeats and the node Lease.
//!
//! Registers (or adopts) the Node object with hostname/os/arch labels, capacity and allocatable
//! (CPU = host cores, memory, pods, ephemeral storage), addresses, nodeInfo and Ready=True with
//! the pressure conditions False; then every heartbeat patches the conditions' heartbeat times and
//! renews `kube-node-lease/<node>`. The `not-ready` taint the API server adds at creation is
//! removed once, since no node lifecycle controller runs.
//!
//! Invariants: `lastTransitionTime` of a condition is set once (the kubelet never reports NotReady,
//! it just stops); a failed heartbeat is logged and retried on the next tick, never fatal.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::context::Ctx;
use super::error::Result;
use super::pod::NodeResources;

const LEASE_NAMESPACE: &str = "kube-node-lease";
const LEASE_SECONDS: i32 = 40;

impl NodeResources {
    /// The host's cores and memory, and the free space of `state_dir`.
    pub fn detect(state_dir: &std::path::Path) -> Self {
        let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                let line = m.lines().find(|l| l.starts_with("MemTotal:"))?.to_string();
                line.split_whitespace().nth(1)?.parse::<f64>().ok()
            })
            .map_or(8.0 * 1024f64.powi(3), |kib| kib * 1024.0);
        let ephemeral_storage = nix::sys::statvfs::statvfs(state_dir)
            .map(|s| s.blocks() as f64 * s.fragment_size() as f64)
            .unwrap_or(100.0 * 1024f64.powi(3));
        NodeResources {
            cpu,
            memory,
            ephemeral_storage,
        }
    }
}

/// The labels the Node carries (also what nodeSelectors are matched against).
pub fn labels(node_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), node_name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), arch().to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), arch().to_string()),
        (
            "node.kubernetes.io/instance-type".to_string(),
            "mf-process".to_string(),
        ),
    ])
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Creates the Node, or updates the existing one's labels and status.
pub async fn register(ctx: &Ctx) -> Result<()> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let name = &ctx.config.node_name;
    let status = node_status(ctx);
    match api.get_opt(name).await? {
        None => {
            let node = Node {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(labels(name)),
                    ..Default::default()
                },
                status: Some(status.clone()),
                ..Default::default()
            };
            api.create(&PostParams::default(), &node).await?;
            tracing::info!(node = %name, "registered the node");
        }
        Some(_) => {
            let patch = json!({ "metadata": { "labels": labels(name) } });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            tracing::info!(node = %name, "adopted the existing node");
        }
    }
    // Creation may drop status; set it on the subresource either way.
    let patch = json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    remove_condition_taints(&api, name).await
}

/// Taints that only the (disabled) node lifecycle controller would remove: the API server's
/// TaintNodesByCondition admission adds `not-ready` at creation, and this node is ready.
const CONDITION_TAINTS: [&str; 2] = ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"];

async fn remove_condition_taints(api: &Api<Node>, name: &str) -> Result<()> {
    let node = api.get(name).await?;
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    if !taints.iter().any(|t| CONDITION_TAINTS.contains(&t.key.as_str())) {
        return Ok(());
    }
    let kept: Vec<_> = taints
        .into_iter()
        .filter(|t| !CONDITION_TAINTS.contains(&t.key.as_str()))
        .collect();
    let patch = json!({
        "metadata": { "resourceVersion": node.metadata.resource_version },
        "spec": { "taints": kept },
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    tracing::info!(node = %name, "removed the not-ready taint");
    Ok(())
}

fn node_status(ctx: &Ctx) -> NodeStatus {
    let r = &ctx.node;
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity(format!("{}", r.cpu as u64))),
        (
            "memory".to_string(),
            Quantity(format!("{}Ki", (r.memory / 1024.0) as u64)),
        ),
        (
            "ephemeral-storage".to_string(),
            Quantity(format!("{}Ki", (r.ephemeral_storage / 1024.0) as u64)),
        ),
        ("pods".to_string(), Quantity(ctx.config.max_pods.to_string())),
    ]);
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let os_image = read("/etc/os-release")
        .lines()
        .find_map(|l| {
            l.strip_prefix("PRETTY_NAME=")
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| "Linux".to_string());
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        conditions: Some(conditions(&Time(super::pod::now()))),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: ctx.config.node_ip.to_string(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: ctx.config.node_name.clone(),
            },
        ]),
        node_info: Some(NodeSystemInfo {
            architecture: arch().to_string(),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            container_runtime_version: "mf-process://0.1".into(),
            kernel_version: read("/proc/sys/kernel/osrelease"),
            kube_proxy_version: String::new(),
            kubelet_version: ctx.config.kubelet_version.clone(),
            machine_id: read("/etc/machine-id"),
            operating_system: "linux".into(),
            os_image,
            system_uuid: read("/etc/machine-id"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn conditions(now: &Time) -> Vec<NodeCondition> {
    let cond = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    vec![
        cond(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        cond(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        ),
        cond(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        cond(
            "Ready",
            "True",
            "KubeletReady",
            "mf-kubelet is posting ready status",
        ),
    ]
}

/// Heartbeats until `shutdown`: condition heartbeat times and the node Lease.
pub async fn heartbeat(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), LEASE_NAMESPACE);
    let name = ctx.config.node_name.clone();
    let mut transition: Option<Time> = None;
    let mut ticker = tokio::time::interval(ctx.config.heartbeat);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if let Err(e) = renew_lease(&leases, &nodes, &name).await {
            tracing::warn!(error = %e, "node lease renewal failed");
        }
        let now = Time(super::pod::now());
        let since = transition.get_or_insert_with(|| now.clone()).clone();
        let conds: Vec<NodeCondition> = conditions(&now)
            .into_iter()
            .map(|mut c| {
                c.last_transition_time = Some(since.clone());
                c
            })
            .collect();
        let patch = json!({ "status": { "conditions": conds } });
        if let Err(e) = nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            tracing::warn!(error = %e, "node status heartbeat failed");
        }
    }
}

async fn renew_lease(leases: &Api<Lease>, nodes: &Api<Node>, name: &str) -> Result<()> {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let patch = json!({
        "spec": { "holderIdentity": name, "renewTime": now, "leaseDurationSeconds": LEASE_SECONDS },
    });
    match leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        other => return other.map(drop).map_err(Into::into),
    }
    let node = nodes.get(name).await?;
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(LEASE_NAMESPACE.to_string()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: name.to_string(),
                uid: node.metadata.uid.unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_string()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(now),
            ..Default::default()
        }),
    };
    leases.create(&PostParams::default(), &lease).await?;
    Ok(())
}
