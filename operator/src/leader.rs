//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager): only the holder reconciles.
//! A replica that loses the Lease exits so that it restarts as a follower with a clean state; the
//! standby takes over once the Lease expires (duration 10 s, renewed 3 s before expiry: failover < 15 s).

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
use std::time::Duration;

/// Lease timing, in seconds.
pub const LEASE_DURATION: u64 = 10;
/// Renew this many seconds before expiry.
pub const LEASE_GRACE: u64 = 3;

/// Blocks until this replica holds the Lease; returns a receiver that turns false if it loses it.
pub async fn acquire(
    client: Client,
    namespace: &str,
    lease: &str,
    identity: &str,
) -> anyhow::Result<tokio::sync::watch::Receiver<bool>> {
    let manager = LeaseManagerBuilder::new(client, lease)
        .with_namespace(namespace)
        .with_parameters(
            LeaseParams::new(identity, LEASE_DURATION, LEASE_GRACE)
                .with_field_manager(format!("modelfleet-operator-{identity}")),
        )
        .build()
        .await?;
    let (mut channel, _task) = manager.watch().await;
    tracing::info!(%lease, %identity, "waiting for the leader lease");
    loop {
        if *channel.borrow_and_update() {
            tracing::info!(%lease, %identity, "acquired the leader lease");
            return Ok(channel);
        }
        if tokio::time::timeout(Duration::from_secs(3600), channel.changed())
            .await
            .is_ok_and(|r| r.is_err())
        {
            anyhow::bail!("the lease manager stopped");
        }
    }
}
