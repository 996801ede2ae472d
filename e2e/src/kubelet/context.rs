//! What every part of the kubelet shares: the API client, configuration, image map, IP
//! allocator, API server access, object caches, node resources and the event sink.
//!
//! Invariant: the IP allocator is the only mutable shared state, behind a mutex held only for an
//! allocation or release; everything else is read-only after start-up.

use std::net::Ipv4Addr;
use std::sync::Mutex;

use kube::Client;

use super::apiserver::ApiAccess;
use super::config::KubeletConfig;
use super::events::EventSink;
use super::images::ImageSource;
use super::ipam::Ipam;
use super::objects::Objects;
use super::pod::NodeResources;

/// Shared by the node, scheduler, manager and pod workers.
pub struct Ctx {
    /// The kubelet's API client.
    pub client: Client,
    /// Validated flags.
    pub config: KubeletConfig,
    /// The image map.
    pub images: ImageSource,
    /// Pod IPs in use.
    pub ipam: Mutex<Ipam>,
    /// How pods reach the API server.
    pub api: ApiAccess,
    /// Secrets and ConfigMaps.
    pub objects: Objects,
    /// The node's allocatable resources.
    pub node: NodeResources,
    /// Core Events.
    pub events: EventSink,
    /// The kubelet's `PATH`, given to containers.
    pub path_env: String,
}

impl Ctx {
    /// A free pod IP: `previous` if it is free (a pod keeps its IP across kubelet restarts), else
    /// the next free one.
    pub fn allocate_ip(&self, previous: Option<Ipv4Addr>) -> Option<Ipv4Addr> {
        let mut ipam = self.ipam.lock().unwrap_or_else(|p| p.into_inner());
        match previous {
            Some(ip) if ipam.reserve(ip) => Some(ip),
            _ => ipam.allocate(),
        }
    }

    /// Returns a pod IP.
    pub fn release_ip(&self, ip: Ipv4Addr) {
        self.ipam.lock().unwrap_or_else(|p| p.into_inner()).release(ip);
    }
}
