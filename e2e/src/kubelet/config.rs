//! Command-line flags of `mf-kubelet` and the validated configuration the kubelet runs with.
//!
//! Every flag can also come from an environment variable `MF_KUBELET_<FLAG>`. Invariant: after
//! [`Args::into_config`] all paths are absolute and the state directory exists.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::error::{Error, Result};
use super::ipam::IpRange;

/// `mf-kubelet`: a process kubelet for local Kubernetes end-to-end tests.
#[derive(Debug, Clone, Parser)]
#[command(name = "mf-kubelet", version, about)]
pub struct Args {
    /// Kubeconfig with the kubelet's own client identity.
    #[arg(long, env = "MF_KUBELET_KUBECONFIG")]
    pub kubeconfig: PathBuf,
    /// Name of the Node this kubelet registers and runs pods for.
    #[arg(long, env = "MF_KUBELET_NODE_NAME", default_value = "mf-node-0")]
    pub node_name: String,
    /// The node's address (status.hostIP of its pods, and the address of hostNetwork pods).
    #[arg(long, env = "MF_KUBELET_NODE_IP", default_value = "127.0.0.1")]
    pub node_ip: Ipv4Addr,
    /// Directory for pods' directories (`pods/`) and kept logs (`logs/`).
    #[arg(long, env = "MF_KUBELET_STATE_DIR")]
    pub state_dir: PathBuf,
    /// Image map (YAML) from container images to local programs.
    #[arg(long, env = "MF_KUBELET_IMAGES")]
    pub images: PathBuf,
    /// CIDR that pod IPs are allocated from (network and broadcast addresses excluded).
    #[arg(long, env = "MF_KUBELET_IP_RANGE", default_value = "127.1.0.0/16")]
    pub ip_range: IpRange,
    /// API server URL written into pods' kubeconfigs (default: the kubelet's kubeconfig server).
    #[arg(long, env = "MF_KUBELET_APISERVER_URL")]
    pub apiserver_url: Option<String>,
    /// CA bundle written into pods' kubeconfigs (default: the kubelet's kubeconfig CA).
    #[arg(long, env = "MF_KUBELET_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Do not bind pending pods (when a real kube-scheduler runs).
    #[arg(long, env = "MF_KUBELET_DISABLE_SCHEDULER")]
    pub disable_scheduler: bool,
    /// `status.capacity.pods` of the Node.
    #[arg(long, env = "MF_KUBELET_MAX_PODS", default_value_t = 110)]
    pub max_pods: u32,
    /// Seconds between Node status heartbeats and Lease renewals.
    #[arg(long, env = "MF_KUBELET_HEARTBEAT_SECONDS", default_value_t = 10)]
    pub heartbeat_seconds: u64,
    /// Grace (seconds) between SIGTERM and SIGKILL for pods stopped because the kubelet exits or
    /// the pod vanished from the API.
    #[arg(long, env = "MF_KUBELET_SHUTDOWN_GRACE_SECONDS", default_value_t = 5)]
    pub shutdown_grace_seconds: u64,
    /// `status.nodeInfo.kubeletVersion` reported by the Node.
    #[arg(long, env = "MF_KUBELET_VERSION", default_value = "v1.35.4")]
    pub kubelet_version: String,
}

/// The kubelet's configuration, validated.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// The kubelet's own kubeconfig.
    pub kubeconfig: PathBuf,
    /// The Node's name.
    pub node_name: String,
    /// The Node's address.
    pub node_ip: Ipv4Addr,
    /// Root of the kubelet's files; absolute, exists.
    pub state_dir: PathBuf,
    /// The image map file.
    pub images: PathBuf,
    /// Pod IP range.
    pub ip_range: IpRange,
    /// Override of the API server URL given to pods.
    pub apiserver_url: Option<String>,
    /// Override of the CA given to pods.
    pub ca_file: Option<PathBuf>,
    /// Whether this kubelet binds pending pods to its node.
    pub schedule: bool,
    /// Node pod capacity.
    pub max_pods: u32,
    /// Period of Node status heartbeats and Lease renewals.
    pub heartbeat: Duration,
    /// TERM→KILL grace when pods stop for reasons other than their deletion.
    pub shutdown_grace: Duration,
    /// Reported kubelet version.
    pub kubelet_version: String,
}

impl Args {
    /// Validates the flags, makes paths absolute and creates the state directory.
    pub fn into_config(self) -> Result<KubeletConfig> {
        let absolute =
            |p: PathBuf| -> Result<PathBuf> { std::path::absolute(&p).map_err(|e| Error::io(p, e)) };
        if self.node_name.is_empty() {
            return Err(Error::Config("--node-name must not be empty".into()));
        }
        let state_dir = absolute(self.state_dir)?;
        std::fs::create_dir_all(&state_dir).map_err(|e| Error::io(&state_dir, e))?;
        Ok(KubeletConfig {
            kubeconfig: absolute(self.kubeconfig)?,
            node_name: self.node_name,
            node_ip: self.node_ip,
            state_dir,
            images: absolute(self.images)?,
            ip_range: self.ip_range,
            apiserver_url: self.apiserver_url,
            ca_file: self.ca_file.map(absolute).transpose()?,
            schedule: !self.disable_scheduler,
            max_pods: self.max_pods,
            heartbeat: Duration::from_secs(self.heartbeat_seconds.max(1)),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_seconds),
            kubelet_version: self.kubelet_version,
        })
    }
}
