//! The worker's sync step: set up the sandbox, refresh tokens and volumes, start containers in
//! Kubernetes order, escalate kills, and stop sidecars once the main containers are done.
//!
//! Invariants: an init container starts only when every earlier one completed (sidecars: started);
//! regular containers start only after all init containers; nothing starts while the sandbox has a
//! problem; each start attempt has a new instance number.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::container::{AbortOnDrop, Kind, State};
use super::fields::FieldContext;
use super::launch::{self, LaunchError, LaunchInputs};
use super::probes::{self, ProbeTarget};
use super::token::{self, TokenKey, TokenOwner};
use super::volumes::{self, PlanInputs};
use super::{Event, PodWorker, Slot, process};

/// Delay before retrying an image or configuration problem of a container.
const RETRY: Duration = Duration::from_secs(10);
/// Delay before retrying a sandbox problem (token request, volume write); missing Secrets and
/// ConfigMaps are retried as soon as they appear.
const SANDBOX_RETRY: Duration = Duration::from_secs(5);

impl PodWorker {
    pub(super) async fn sync(&mut self) {
        self.escalate_kills();
        if !self.ensure_sandbox().await {
            return;
        }
        let now = Instant::now();
        for index in 0..self.init.len() {
            let c = &self.init[index];
            let done = match c.kind {
                Kind::Sidecar => c.ever_started,
                _ => c.finished() == Some(0),
            };
            if done {
                if c.kind == Kind::Sidecar && c.can_start(now) {
                    self.start(Slot { init: true, index }).await;
                }
                continue;
            }
            if c.can_start(now) {
                self.start(Slot { init: true, index }).await;
            }
            return;
        }
        for index in 0..self.main.len() {
            if self.main[index].can_start(now) {
                self.start(Slot { init: false, index }).await;
            }
        }
        self.stop_sidecars_when_done();
    }

    /// SIGKILLs containers whose grace period ran out.
    fn escalate_kills(&mut self) {
        let now = Instant::now();
        for c in self.all() {
            if let State::Running { pid, kill_at, .. } = &mut c.state
                && kill_at.is_some_and(|t| t <= now)
            {
                process::signal_group(*pid, Signal::SIGKILL);
                *kill_at = None;
            }
        }
    }

    /// Once every regular container finished for good, sidecars are stopped (they never restart).
    fn stop_sidecars_when_done(&mut self) {
        if self.main.is_empty() || self.main.iter().any(|c| c.finished().is_none()) {
            return;
        }
        let grace = self.grace_seconds();
        for index in 0..self.init.len() {
            let c = &mut self.init[index];
            if c.kind == Kind::Sidecar {
                c.stopping = true;
                c.abandon();
                if c.is_running() && c.wake_at().is_none() {
                    self.kill(Slot { init: true, index }, grace);
                }
            }
        }
    }

    /// Directory, IP, credentials and volumes. Returns whether containers may start.
    async fn ensure_sandbox(&mut self) -> bool {
        if self.sandbox.retry_at.is_some_and(|t| t > Instant::now()) {
            return false;
        }
        let result = self.prepare_sandbox().await;
        let problem = result.err();
        let blocked = problem.as_deref().map(|m| ("CreateContainerConfigError", m));
        for c in self.all() {
            c.set_blocked(blocked);
        }
        if let Some(p) = &problem
            && self.sandbox.problem.as_ref() != Some(p)
        {
            let pod = self.pod.clone();
            let reason = if p.contains("MountVolume") {
                "FailedMount"
            } else {
                "Failed"
            };
            self.ctx.events.warning(&pod, reason, p.clone());
        }
        self.sandbox.retry_at = problem.as_ref().map(|_| Instant::now() + SANDBOX_RETRY);
        self.sandbox.problem = problem;
        self.sandbox.problem.is_none()
    }

    async fn prepare_sandbox(&mut self) -> Result<(), String> {
        if !self.sandbox.ready {
            for sub in ["volumes", "containers", "logs"] {
                let path = self.dir.root().join(sub);
                std::fs::create_dir_all(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
            }
            let host_network = self.pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
            if host_network {
                self.pod_ip = self.ctx.config.node_ip.to_string();
            } else {
                let status = self.pod.status.as_ref();
                let previous = status
                    .and_then(|s| s.pod_ip.as_deref())
                    .and_then(|ip| ip.parse().ok());
                let ip = self
                    .ctx
                    .allocate_ip(previous)
                    .ok_or("no free pod IP left in --ip-range")?;
                self.ip = Some(ip);
                self.pod_ip = ip.to_string();
            }
            self.report.start_sandbox();
            self.sandbox.ready = true;
        }
        self.refresh_tokens().await?;
        if self.sandbox.volumes_dirty || self.sandbox.problem.is_some() {
            self.write_volumes()?;
            self.sandbox.volumes_dirty = false;
        }
        Ok(())
    }

    /// Requests tokens that are missing or due, and writes the kubeconfig.
    async fn refresh_tokens(&mut self) -> Result<(), String> {
        let mut keys = volumes::token_keys(&self.pod);
        if self.kubeconfig {
            keys.push(TokenKey::kubeconfig());
        }
        let spec = self.pod.spec.as_ref();
        let sa = spec
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty());
        let sa = sa.unwrap_or_else(|| "default".to_string());
        let ns = self.pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<ServiceAccount> = Api::namespaced(self.ctx.client.clone(), &ns);
        let (name, uid) = (
            self.pod.metadata.name.clone().unwrap_or_default(),
            self.pod.metadata.uid.clone().unwrap_or_default(),
        );
        let owner = TokenOwner {
            service_account: &sa,
            pod_name: &name,
            pod_uid: &uid,
        };
        for key in keys {
            if !self.tokens.due(&key) {
                continue;
            }
            match token::request(&api, &owner, &key).await {
                Ok((value, lifetime)) => {
                    if key == TokenKey::kubeconfig() {
                        write_file(&self.dir.token(), value.as_bytes(), 0o600)?;
                    }
                    self.tokens.insert(key, value, lifetime);
                    self.sandbox.volumes_dirty = true;
                }
                Err(e) if self.tokens.get(&key).is_some() => {
                    tracing::warn!(pod = %name, error = %e, "token refresh failed; keeping the token");
                    self.tokens.insert(
                        key.clone(),
                        self.tokens.get(&key).unwrap_or_default().to_string(),
                        RETRY,
                    );
                }
                Err(e) => {
                    return Err(format!(
                        "failed to get a token for service account {ns}/{sa}: {e}"
                    ));
                }
            }
        }
        if self.kubeconfig && !self.sandbox.kubeconfig_written {
            let text = self.ctx.api.pod_kubeconfig(&self.dir.token(), &ns);
            write_file(&self.dir.kubeconfig(), text.as_bytes(), 0o600)?;
            self.sandbox.kubeconfig_written = true;
        }
        Ok(())
    }

    /// Plans and writes every volume; the first problem is returned.
    fn write_volumes(&mut self) -> Result<(), String> {
        let pod = self.pod.clone();
        let fields = FieldContext {
            pod: &pod,
            pod_ip: &self.pod_ip,
            host_ip: &self.ctx.config.node_ip.to_string(),
        };
        let inputs = PlanInputs {
            fields,
            objects: &self.ctx.objects,
            tokens: &self.tokens,
            node: &self.ctx.node,
        };
        let mut first_problem = None;
        for volume in pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
        {
            match volumes::plan(volume, &inputs) {
                Ok(plan) => {
                    if let Err(e) = self.volumes.apply(&self.dir, &volume.name, &plan) {
                        first_problem.get_or_insert(format!("volume {:?}: {e}", volume.name));
                    }
                }
                Err(message) => {
                    first_problem.get_or_insert(message);
                }
            }
        }
        first_problem.map_or(Ok(()), Err)
    }

    /// Tries to start one container.
    async fn start(&mut self, slot: Slot) {
        let spec = self.spec(slot).clone();
        let images = self.ctx.images.current();
        let host_ip = self.ctx.config.node_ip.to_string();
        let pod = self.pod.clone();
        let prepared = launch::prepare(&LaunchInputs {
            fields: FieldContext {
                pod: &pod,
                pod_ip: &self.pod_ip,
                host_ip: &host_ip,
            },
            container: &spec,
            dir: &self.dir,
            objects: &self.ctx.objects,
            node: &self.ctx.node,
            images: &images,
            api: &self.ctx.api,
            kubeconfig: self.kubeconfig,
            path_env: &self.ctx.path_env,
        });
        let retry_at = Instant::now() + RETRY;
        let prepared = match prepared {
            Ok(p) => p,
            Err(LaunchError::Image(message)) => {
                let c = self.container(slot);
                let first = c.image_failures == 0;
                c.image_failures += 1;
                c.wait_with(
                    if first { "ErrImagePull" } else { "ImagePullBackOff" },
                    message.clone(),
                    retry_at,
                );
                if first {
                    self.ctx.events.warning(&pod, "Failed", message);
                }
                return;
            }
            Err(LaunchError::Config(message)) => {
                let c = self.container(slot);
                let repeated = matches!(&c.state, State::Waiting { message: Some(m), .. } if *m == message);
                c.wait_with("CreateContainerConfigError", message.clone(), retry_at);
                if !repeated {
                    self.ctx
                        .events
                        .warning(&pod, "Failed", format!("Error: {message}"));
                }
                return;
            }
            Err(LaunchError::Start(message)) => {
                self.container(slot).on_start_error(message.clone());
                self.ctx
                    .events
                    .warning(&pod, "Failed", format!("Error: {message}"));
                return;
            }
        };
        let instance = self.next_instance;
        self.next_instance += 1;
        let log_start = std::fs::metadata(&prepared.spec.log).map_or(0, |m| m.len());
        let tx = self.tx.clone();
        let spawned = process::spawn(&prepared.spec, move |exit| {
            let _ = tx.send(Event::Exited { slot, instance, exit });
        });
        let pid = match spawned {
            Ok(pid) => pid,
            Err(e) => {
                let message = format!("failed to start {}: {e}", prepared.spec.program.display());
                self.container(slot).on_start_error(message.clone());
                self.ctx
                    .events
                    .warning(&pod, "Failed", format!("Error: {message}"));
                return;
            }
        };
        let image_id = format!("mf-process://{}", prepared.spec.program.display());
        let target = ProbeTarget {
            pod_ip: self.pod_ip.clone(),
            ports: spec
                .ports
                .iter()
                .flatten()
                .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.container_port).ok()?)))
                .collect::<HashMap<_, _>>(),
            env: prepared.spec.env.clone(),
            cwd: prepared.spec.cwd.clone(),
            rewriter: prepared.rewriter.clone(),
            image: prepared.image.clone(),
            path_env: self.ctx.path_env.clone(),
        };
        let tx = self.tx.clone();
        let probe_task = tokio::spawn(probes::run(spec.clone(), Arc::new(target), move |update| {
            let _ = tx.send(Event::Probe {
                slot,
                instance,
                update,
            });
        }));
        let c = self.container(slot);
        let first = !c.ever_started;
        c.on_started(pid, instance, image_id);
        c.log_start = log_start;
        c.probes = Some(AbortOnDrop(probe_task));
        tracing::info!(pod = %self.dir.root().display(), container = %spec.name, pid, "container started");
        if first {
            let image = spec.image.clone().unwrap_or_default();
            let events = &self.ctx.events;
            events.normal(
                &pod,
                "Pulled",
                format!("Container image {image:?} already present on machine"),
            );
            events.normal(&pod, "Created", format!("Created container: {}", spec.name));
        }
        self.ctx
            .events
            .normal(&pod, "Started", format!("Started container {}", spec.name));
    }

    /// Once terminal with no process left: release the IP (the directory stays until deletion).
    pub(super) fn settle_terminal(&mut self) {
        if self.terminal
            && !self.any_running()
            && let Some(ip) = self.ip.take()
        {
            self.ctx.release_ip(ip);
        }
    }
}

fn write_file(path: &std::path::Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    let result = std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)))
        .and_then(|()| std::fs::rename(&tmp, path));
    result.map_err(|e| format!("writing {}: {e}", path.display()))
}
