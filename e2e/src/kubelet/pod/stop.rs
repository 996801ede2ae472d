//! Stopping a pod: graceful deletion with the final delete, a vanished pod, kubelet shutdown.
//!
//! Deleted (deletionTimestamp set): run the `preStop` hooks of running containers — the `sleep` action
//! only: the containers keep running for its seconds, out of the grace period, as a kubelet does —
//! then SIGTERM every process group, wait up to the rest of the pod's `deletionGracePeriodSeconds`
//! (shortened if the pod is deleted again with less), SIGKILL what is left, write the final status
//! (terminal phase), then delete the object with grace 0 and a UID precondition — the kubelet's
//! "final delete". Vanished or shutdown: no hooks, SIGTERM, the kubelet's `--shutdown-grace-seconds`,
//! SIGKILL, no API calls. `exec` and `httpGet` hooks are not run (e2e/README.md says so).
//!
//! Invariant: this returns only when no process of the pod is left running (or a SIGKILLed
//! process failed to be reaped within 10 s, which is logged).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::{PodUpdate, PodWorker, Slot, process};

/// Why the pod stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The pod object has a deletionTimestamp.
    Deleted,
    /// The pod object is gone.
    Vanished,
    /// The kubelet is shutting down.
    Shutdown,
}

impl PodWorker {
    pub(super) async fn stop(&mut self, reason: StopReason) {
        let grace = match reason {
            StopReason::Deleted => self.deletion_grace(),
            _ => self.ctx.config.shutdown_grace,
        };
        tracing::info!(pod = %self.dir.root().display(), ?reason, grace_s = grace.as_secs(), "stopping pod");
        let running: Vec<String> = self
            .all()
            .filter(|c| c.is_running())
            .map(|c| c.name.clone())
            .collect();
        for c in self.all() {
            c.stopping = true;
            c.probes = None;
        }
        let started = Instant::now();
        if reason == StopReason::Deleted {
            let hook = self.pre_stop_sleep().min(grace);
            if !hook.is_zero() {
                tracing::info!(pod = %self.dir.root().display(), hook_s = hook.as_secs(), "preStop sleep before SIGTERM");
                self.serve_until(started + hook).await;
            }
        }
        let left = grace.saturating_sub(started.elapsed());
        for (init, len) in [(true, self.init.len()), (false, self.main.len())] {
            for index in 0..len {
                self.kill(Slot { init, index }, left.as_secs());
            }
        }
        if reason == StopReason::Deleted {
            let pod = self.pod.clone();
            for name in running {
                self.ctx
                    .events
                    .normal(&pod, "Killing", format!("Stopping container {name}"));
            }
        }
        self.wait_for_exits(reason, started + grace).await;
        if reason != StopReason::Deleted {
            return;
        }
        for c in self.all() {
            c.abandon();
        }
        self.stopped = true;
        self.report().await;
        self.final_delete().await;
    }

    /// The longest `preStop` `sleep` among the running main containers (hooks run side by side).
    fn pre_stop_sleep(&self) -> Duration {
        self.main_specs
            .iter()
            .zip(&self.main)
            .filter(|(_, rt)| rt.is_running())
            .filter_map(|(spec, _)| spec.lifecycle.as_ref()?.pre_stop.as_ref()?.sleep.as_ref())
            .map(|s| Duration::from_secs(s.seconds.max(0) as u64))
            .max()
            .unwrap_or_default()
    }

    /// Lets the processes run (recording their exits) until `until` or until none runs.
    async fn serve_until(&mut self, until: Instant) {
        while self.any_running() {
            tokio::select! {
                Some(event) = self.rx.recv() => self.handle(event),
                _ = tokio::time::sleep_until(until) => return,
            }
        }
    }

    /// The grace period of a deleted pod.
    fn deletion_grace(&self) -> Duration {
        let seconds = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .unwrap_or(self.grace_seconds() as i64);
        Duration::from_secs(seconds.max(0) as u64)
    }

    /// Handles exits until no process runs; SIGKILLs at `deadline`.
    async fn wait_for_exits(&mut self, reason: StopReason, mut deadline: Instant) {
        let mut killed = false;
        while self.any_running() {
            tokio::select! {
                Some(event) = self.rx.recv() => self.handle(event),
                _ = tokio::time::sleep_until(deadline) => {
                    if killed {
                        let pod = self.dir.root().display();
                        tracing::error!(pod = %pod, "processes survived SIGKILL for 10s");
                        return;
                    }
                    for c in self.all() {
                        if let Some(pid) = c.pid() {
                            process::signal_group(pid, Signal::SIGKILL);
                        }
                    }
                    killed = true;
                    deadline = Instant::now() + Duration::from_secs(10);
                }
                changed = self.updates.changed(), if reason == StopReason::Deleted && !killed => {
                    let update = match changed {
                        Ok(()) => self.updates.borrow_and_update().clone(),
                        Err(_) => PodUpdate::Gone,
                    };
                    match update {
                        PodUpdate::Gone => deadline = Instant::now(),
                        PodUpdate::Present(pod) => {
                            self.pod = pod;
                            deadline = deadline.min(Instant::now() + self.deletion_grace());
                        }
                    }
                }
            }
        }
    }

    /// Deletes the pod object for good (grace 0, UID precondition), retrying transient errors.
    async fn final_delete(&mut self) {
        let ns = self.pod.metadata.namespace.clone().unwrap_or_default();
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &ns);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: self.pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        for attempt in 0..5u32 {
            match api.delete(&name, &params).await {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, attempt, "final delete failed");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1 << attempt)) => {}
                        _ = self.shutdown.cancelled() => return,
                    }
                }
            }
        }
    }

    /// Releases the IP, keeps copies of the logs and removes the pod directory.
    pub(super) fn cleanup(&mut self) {
        if let Some(ip) = self.ip.take() {
            self.ctx.release_ip(ip);
        }
        let names: Vec<String> = self
            .init_specs
            .iter()
            .chain(&self.main_specs)
            .map(|c| c.name.clone())
            .collect();
        for name in names {
            let log = self.dir.log(&name);
            if log.exists() {
                let kept = self.dir.kept_log(&name);
                if let Some(parent) = kept.parent() {
                    let _ = std::fs::create_dir_all(parent);
                }
                if let Err(e) = std::fs::copy(&log, &kept) {
                    tracing::warn!(log = %log.display(), error = %e, "could not keep a container log");
                }
            }
        }
        if let Err(e) = std::fs::remove_dir_all(self.dir.root())
            && e.kind() != std::io::ErrorKind::NotFound
        {
            let dir = self.dir.root().display();
            tracing::warn!(dir = %dir, error = %e, "could not remove the pod directory");
        }
    }
}
