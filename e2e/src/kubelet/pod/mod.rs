//! One pod's worker: the single owner of everything about one pod on this node.
//!
//! The manager starts one worker task per pod UID and feeds it the latest Pod object through a
//! `watch` channel. The worker owns the pod's directory, IP, volumes, tokens, container processes
//! and status; processes and probe tasks report back over an mpsc channel. Each loop turn it
//! (1) syncs: sets up the sandbox (directory, IP, kubeconfig, volumes), starts init containers in
//! order and then the containers, escalates kills; (2) reports: computes the status and patches
//! it only if it differs from what it last sent; (3) sleeps until the next event or deadline.
//!
//! Invariants: no busy loops (every wake-up is an event or a deadline); a status is written only
//! on change; events from an earlier container instance are ignored; the worker exits only after
//! every process it started has exited, and it then releases the IP and removes the directory.
//!
//! Submodules: `sync` (start things), `report` (status), `stop` (termination), and the pure parts
//! `status`, `container`, `launch`, `env`, `fields`, `volumes`, `termination`, `probes`.

mod container;
mod dir;
mod env;
mod fields;
mod launch;
mod probes;
mod process;
mod report;
mod status;
mod stop;
mod sync;
mod termination;
mod token;
mod volumes;

use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::container::{ContainerRt, Kind};
use self::probes::ProbeUpdate;
use self::process::ExitInfo;
use self::status::RestartPolicy;
use self::token::TokenCache;
use self::volumes::VolumeWriter;
use super::context::Ctx;

pub use self::dir::PodDir;
pub use self::fields::NodeResources;
pub use self::process::{kill_leftover, now};

/// What the manager tells a worker.
#[derive(Debug, Clone)]
pub enum PodUpdate {
    /// The latest object.
    Present(Arc<Pod>),
    /// The pod is gone from the API (force-deleted, or deleted while the kubelet was away).
    Gone,
}

/// Which container: index into the init or regular list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    init: bool,
    index: usize,
}

/// Reports from processes and probe tasks.
#[derive(Debug)]
enum Event {
    Exited {
        slot: Slot,
        instance: u64,
        exit: ExitInfo,
    },
    Probe {
        slot: Slot,
        instance: u64,
        update: ProbeUpdate,
    },
}

/// Pod-level readiness to start containers.
#[derive(Debug, Default)]
struct Sandbox {
    /// Directories created and IP assigned.
    ready: bool,
    /// Why containers cannot start (volumes, tokens); shown as CreateContainerConfigError.
    problem: Option<String>,
    /// When to retry after a problem.
    retry_at: Option<Instant>,
    /// Volumes must be re-planned (sources or pod changed).
    volumes_dirty: bool,
    /// The kubeconfig file was written.
    kubeconfig_written: bool,
}

/// The worker's state.
struct PodWorker {
    ctx: Arc<Ctx>,
    pod: Arc<Pod>,
    updates: watch::Receiver<PodUpdate>,
    shutdown: CancellationToken,
    dir: PodDir,
    /// The allocated IP while held (not for hostNetwork pods).
    ip: Option<Ipv4Addr>,
    /// The pod IP shown in the status (kept after release).
    pod_ip: String,
    init_specs: Vec<Container>,
    main_specs: Vec<Container>,
    init: Vec<ContainerRt>,
    main: Vec<ContainerRt>,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    objects: watch::Receiver<u64>,
    sandbox: Sandbox,
    volumes: VolumeWriter,
    tokens: TokenCache,
    /// Whether the pod gets a kubeconfig (automountServiceAccountToken is not false).
    kubeconfig: bool,
    report: report::Reporter,
    next_instance: u64,
    /// The phase is terminal: nothing starts any more.
    terminal: bool,
    /// The pod was already terminal when this worker started: never write its status.
    frozen: bool,
    /// The pod was deleted and its processes stopped: the phase becomes terminal.
    stopped: bool,
}

/// Runs the worker of one pod until the pod is gone or the kubelet shuts down.
pub async fn run(
    ctx: Arc<Ctx>,
    pod: Arc<Pod>,
    updates: watch::Receiver<PodUpdate>,
    shutdown: CancellationToken,
) {
    let mut worker = PodWorker::new(ctx, pod, updates, shutdown);
    worker.main_loop().await;
    worker.cleanup();
}

impl PodWorker {
    fn new(
        ctx: Arc<Ctx>,
        pod: Arc<Pod>,
        updates: watch::Receiver<PodUpdate>,
        shutdown: CancellationToken,
    ) -> Self {
        let meta = &pod.metadata;
        let (ns, name, uid) = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
            meta.uid.clone().unwrap_or_default(),
        );
        let dir = PodDir::new(&ctx.config.state_dir, &ns, &name, &uid);
        let spec = pod.spec.clone().unwrap_or_default();
        let policy = RestartPolicy::parse(spec.restart_policy.as_deref());
        let init_specs = spec.init_containers.clone().unwrap_or_default();
        let has_init = !init_specs.is_empty();
        let init: Vec<ContainerRt> = init_specs
            .iter()
            .map(|c| {
                let kind = if c.restart_policy.as_deref() == Some("Always") {
                    Kind::Sidecar
                } else {
                    Kind::Init
                };
                ContainerRt::new(c, kind, policy, has_init)
            })
            .collect();
        let main: Vec<ContainerRt> = spec
            .containers
            .iter()
            .map(|c| ContainerRt::new(c, Kind::Regular, policy, has_init))
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        let objects = ctx.objects.subscribe();
        let kubeconfig = spec.automount_service_account_token != Some(false);
        let mut worker = PodWorker {
            report: report::Reporter::from_pod(&pod),
            ctx,
            updates,
            shutdown,
            dir,
            ip: None,
            pod_ip: String::new(),
            init_specs,
            main_specs: spec.containers.clone(),
            init,
            main,
            tx,
            rx,
            objects,
            sandbox: Sandbox {
                volumes_dirty: true,
                ..Default::default()
            },
            volumes: VolumeWriter::default(),
            tokens: TokenCache::default(),
            kubeconfig,
            next_instance: 1,
            terminal: false,
            frozen: false,
            stopped: false,
            pod,
        };
        worker.resume();
        worker
    }

    /// Continues from the status a previous kubelet wrote (restart counts, finished containers).
    fn resume(&mut self) {
        let status = self.pod.status.clone().unwrap_or_default();
        if status.phase.as_deref().is_some_and(status::is_terminal) {
            self.terminal = true;
            self.frozen = true;
            return;
        }
        for (list, previous) in [
            (&mut self.init, &status.init_container_statuses),
            (&mut self.main, &status.container_statuses),
        ] {
            for c in list.iter_mut() {
                if let Some(p) = previous.iter().flatten().find(|p| p.name == c.name) {
                    c.resume(p);
                }
            }
        }
    }

    async fn main_loop(&mut self) {
        if self.pod.metadata.deletion_timestamp.is_some() {
            self.stop(stop::StopReason::Deleted).await;
            return;
        }
        loop {
            if !self.terminal {
                self.sync().await;
            }
            self.report().await;
            self.settle_terminal();
            let wake = self.next_wake();
            tokio::select! {
                _ = self.shutdown.cancelled() => {
                    self.stop(stop::StopReason::Shutdown).await;
                    return;
                }
                changed = self.updates.changed() => {
                    let update = match changed {
                        Ok(()) => self.updates.borrow_and_update().clone(),
                        Err(_) => PodUpdate::Gone,
                    };
                    match update {
                        PodUpdate::Gone => {
                            self.stop(stop::StopReason::Vanished).await;
                            return;
                        }
                        PodUpdate::Present(pod) => {
                            self.pod = pod;
                            if self.pod.metadata.deletion_timestamp.is_some() {
                                self.stop(stop::StopReason::Deleted).await;
                                return;
                            }
                            self.sandbox.volumes_dirty = true;
                        }
                    }
                }
                Some(event) = self.rx.recv() => {
                    self.handle(event);
                    while let Ok(event) = self.rx.try_recv() {
                        self.handle(event);
                    }
                }
                Ok(()) = self.objects.changed() => {
                    self.sandbox.volumes_dirty = true;
                    self.sandbox.retry_at = None;
                    self.init.iter_mut().chain(self.main.iter_mut()).for_each(ContainerRt::retry_now);
                }
                _ = sleep_until(wake) => {}
            }
        }
    }

    /// The earliest deadline: container retries, restarts and kills, sandbox retries, token
    /// refreshes, status retries.
    fn next_wake(&self) -> Option<Instant> {
        let containers = self
            .init
            .iter()
            .chain(&self.main)
            .filter_map(ContainerRt::wake_at);
        let others = [
            self.sandbox.retry_at,
            self.tokens.next_refresh(),
            self.report.retry_at(),
        ];
        containers.chain(others.into_iter().flatten()).min()
    }

    fn container(&mut self, slot: Slot) -> &mut ContainerRt {
        if slot.init {
            &mut self.init[slot.index]
        } else {
            &mut self.main[slot.index]
        }
    }

    fn spec(&self, slot: Slot) -> &Container {
        if slot.init {
            &self.init_specs[slot.index]
        } else {
            &self.main_specs[slot.index]
        }
    }

    /// Applies a process or probe report.
    fn handle(&mut self, event: Event) {
        match event {
            Event::Exited { slot, instance, exit } => self.on_exit(slot, instance, exit),
            Event::Probe {
                slot,
                instance,
                update,
            } => {
                let c = self.container(slot);
                if c.instance != instance || !c.is_running() {
                    return;
                }
                match update {
                    ProbeUpdate::Started => c.started = true,
                    ProbeUpdate::Ready(ready, message) => {
                        c.ready = ready;
                        if let Some(message) = message {
                            let pod = self.pod.clone();
                            self.ctx.events.warning(&pod, "Unhealthy", message);
                        }
                    }
                    ProbeUpdate::LivenessFailed(message) | ProbeUpdate::StartupFailed(message) => {
                        let name = c.name.clone();
                        let pod = self.pod.clone();
                        self.ctx.events.warning(&pod, "Unhealthy", message);
                        self.ctx.events.normal(
                            &pod,
                            "Killing",
                            format!("Container {name} failed a probe, will be restarted"),
                        );
                        let grace = self.grace_seconds();
                        self.kill(slot, grace);
                    }
                }
            }
        }
    }

    /// Records a container's exit.
    fn on_exit(&mut self, slot: Slot, instance: u64, exit: ExitInfo) {
        let spec = self.spec(slot).clone();
        let c = self.container(slot);
        if c.instance != instance || !c.is_running() {
            return;
        }
        let (pid, log_start) = (c.pid(), c.log_start);
        let fallback = spec.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
        let message = termination::read(
            &self.dir.termination_log(&spec.name),
            &self.dir.log(&spec.name),
            log_start,
            fallback,
            exit.code,
        );
        let c = self.container(slot);
        let delay = c.on_exit(&exit, message, pid.map(|p| format!("mf-process://{p}")));
        let pod = self.dir.root().display();
        tracing::info!(pod = %pod, container = %spec.name, code = exit.code, "container exited");
        if let Some(delay) = delay {
            let pod = self.pod.clone();
            let note = format!(
                "Back-off {}s restarting failed container {}",
                delay.as_secs(),
                spec.name
            );
            self.ctx.events.warning(&pod, "BackOff", note);
        }
    }

    /// SIGTERMs a running container and schedules SIGKILL after `grace` seconds.
    fn kill(&mut self, slot: Slot, grace: u64) {
        let c = self.container(slot);
        if let container::State::Running { pid, kill_at, .. } = &mut c.state {
            process::signal_group(*pid, nix::sys::signal::Signal::SIGTERM);
            *kill_at = Some(Instant::now() + std::time::Duration::from_secs(grace));
            c.probes = None;
        }
    }

    /// `terminationGracePeriodSeconds` of the pod (default 30).
    fn grace_seconds(&self) -> u64 {
        let spec = self.pod.spec.as_ref();
        spec.and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
            .max(0) as u64
    }

    /// Every container, init first.
    fn all(&mut self) -> impl Iterator<Item = &mut ContainerRt> {
        self.init.iter_mut().chain(self.main.iter_mut())
    }

    fn any_running(&self) -> bool {
        self.init.iter().chain(&self.main).any(ContainerRt::is_running)
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
