//! One container's life inside its pod worker: waiting, running, backing off, terminated.
//!
//! Invariants: `restartCount` grows by one each time a container that ran before is started
//! again; `lastState` is the previous termination; a container is restarted only if its
//! effective restart policy allows it (sidecars: always; init containers: on failure unless the
//! pod's policy is Never; regular containers: the pod's policy) and never while its pod is
//! stopping; back-off doubles from 1 s to 30 s and resets after 60 s of running.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::process::ExitInfo;
use super::status::RestartPolicy;

/// Exponential back-off between restarts.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    /// First delay.
    pub const INITIAL: Duration = Duration::from_secs(1);
    /// Longest delay.
    pub const MAX: Duration = Duration::from_secs(30);
    /// A run at least this long resets the delay to [`Backoff::INITIAL`].
    pub const RESET_AFTER: Duration = Duration::from_secs(60);

    /// The delay before restarting a container that ran for `ran_for`.
    pub fn delay_after(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= Self::RESET_AFTER {
            self.next = Self::INITIAL;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: Self::INITIAL }
    }
}

/// Which list a container belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular init container: must exit 0 before the next one starts.
    Init,
    /// An init container with `restartPolicy: Always` (a native sidecar).
    Sidecar,
    /// A regular container.
    Regular,
}

/// Where the container is.
#[derive(Debug, Clone)]
pub enum State {
    /// Not started; `retry_at` delays the next attempt after a failed one.
    Waiting {
        /// Waiting reason shown in the status.
        reason: String,
        /// Optional message.
        message: Option<String>,
        /// Earliest next start attempt.
        retry_at: Option<Instant>,
    },
    /// Its process runs.
    Running {
        /// Process (group) id.
        pid: u32,
        /// When it started.
        started_at: Timestamp,
        /// When it started, monotonic.
        since: Instant,
        /// When a SIGTERMed process gets SIGKILL.
        kill_at: Option<Instant>,
    },
    /// Exited and waiting to be restarted (CrashLoopBackOff).
    BackOff {
        /// When it may start again.
        until: Instant,
        /// The status message.
        message: String,
    },
    /// Exited for good.
    Terminated(ContainerStateTerminated),
}

/// Aborts a task when dropped (the probe task of a container instance).
#[derive(Debug)]
pub struct AbortOnDrop(pub JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A container's runtime record.
#[derive(Debug)]
pub struct ContainerRt {
    /// Container name.
    pub name: String,
    /// Image reference as in the spec.
    pub image: String,
    /// Init, sidecar or regular.
    pub kind: Kind,
    /// Effective restart policy.
    pub policy: RestartPolicy,
    /// Current state.
    pub state: State,
    /// Restarts so far.
    pub restart_count: i32,
    /// Previous termination.
    pub last_terminated: Option<ContainerStateTerminated>,
    /// Readiness (probe result).
    pub ready: bool,
    /// Startup probe passed.
    pub started: bool,
    /// Whether it was ever started (so the next start is a restart).
    pub ever_started: bool,
    /// Identifies the running instance, to ignore events from earlier ones.
    pub instance: u64,
    /// The instance's probe task.
    pub probes: Option<AbortOnDrop>,
    /// The pod is stopping: do not restart.
    pub stopping: bool,
    /// Failed image resolutions in a row (ErrImagePull first, then ImagePullBackOff).
    pub image_failures: u32,
    /// Resolved program, reported as imageID.
    pub image_id: String,
    /// Length of the log file when the current run started (its output follows).
    pub log_start: u64,
    /// Waiting reason used before the first start.
    default_reason: &'static str,
    /// The waiting reason shows a pod-level problem (see [`ContainerRt::set_blocked`]).
    blocked: bool,
    backoff: Backoff,
}

impl ContainerRt {
    /// A container not started yet.
    pub fn new(container: &Container, kind: Kind, pod_policy: RestartPolicy, has_init: bool) -> Self {
        let policy = match kind {
            Kind::Sidecar => RestartPolicy::Always,
            Kind::Init if pod_policy == RestartPolicy::Never => RestartPolicy::Never,
            Kind::Init => RestartPolicy::OnFailure,
            Kind::Regular => pod_policy,
        };
        let default_reason = if has_init {
            "PodInitializing"
        } else {
            "ContainerCreating"
        };
        ContainerRt {
            name: container.name.clone(),
            image: container.image.clone().unwrap_or_default(),
            kind,
            policy,
            state: State::Waiting {
                reason: default_reason.into(),
                message: None,
                retry_at: None,
            },
            restart_count: 0,
            last_terminated: None,
            ready: false,
            started: false,
            ever_started: false,
            instance: 0,
            probes: None,
            stopping: false,
            image_failures: 0,
            image_id: String::new(),
            log_start: 0,
            default_reason,
            blocked: false,
            backoff: Backoff::default(),
        }
    }

    /// Continues from the status a previous kubelet reported: keeps restart counts and does not
    /// re-run containers that finished for good.
    pub fn resume(&mut self, previous: &ContainerStatus) {
        self.restart_count = previous.restart_count;
        self.last_terminated = previous.last_state.as_ref().and_then(|s| s.terminated.clone());
        let state = previous.state.as_ref();
        self.ever_started = self.last_terminated.is_some()
            || state.is_some_and(|s| s.running.is_some() || s.terminated.is_some());
        if let Some(t) = state.and_then(|s| s.terminated.as_ref())
            && !self.policy.restarts(t.exit_code)
        {
            self.state = State::Terminated(t.clone());
        }
    }

    /// Whether a start may be attempted now.
    pub fn can_start(&self, now: Instant) -> bool {
        if self.stopping {
            return false;
        }
        match &self.state {
            State::Waiting { retry_at, .. } => retry_at.is_none_or(|t| t <= now),
            State::BackOff { until, .. } => *until <= now,
            _ => false,
        }
    }

    /// Whether the process runs.
    pub fn is_running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    /// The running process group.
    pub fn pid(&self) -> Option<u32> {
        match self.state {
            State::Running { pid, .. } => Some(pid),
            _ => None,
        }
    }

    /// The next moment something is due for this container (retry, restart, SIGKILL).
    pub fn wake_at(&self) -> Option<Instant> {
        match &self.state {
            State::Waiting { retry_at, .. } => *retry_at,
            State::BackOff { until, .. } => Some(*until),
            State::Running { kill_at, .. } => *kill_at,
            State::Terminated(_) => None,
        }
    }

    /// Shows a pod-level problem (volumes) on a container that has not started yet, or clears it.
    pub fn set_blocked(&mut self, problem: Option<(&str, &str)>) {
        if let State::Waiting { reason, message, .. } = &mut self.state
            && !self.ever_started
        {
            match problem {
                Some((r, m)) => {
                    (*reason, *message) = (r.to_string(), Some(m.to_string()));
                    self.blocked = true;
                }
                None if self.blocked => {
                    (*reason, *message) = (self.default_reason.to_string(), None);
                    self.blocked = false;
                }
                None => {}
            }
        }
    }

    /// Records a failed start attempt that is retried later (image or config problem).
    pub fn wait_with(&mut self, reason: &str, message: String, retry_at: Instant) {
        self.blocked = false;
        self.state = State::Waiting {
            reason: reason.into(),
            message: Some(message),
            retry_at: Some(retry_at),
        };
    }

    /// Lets a container waiting on a configuration problem retry at once (its sources changed).
    pub fn retry_now(&mut self) {
        if let State::Waiting { reason, retry_at, .. } = &mut self.state
            && reason == "CreateContainerConfigError"
        {
            *retry_at = None;
        }
    }

    /// Records a started process.
    pub fn on_started(&mut self, pid: u32, instance: u64, image_id: String) {
        if self.ever_started {
            self.restart_count += 1;
        }
        self.ever_started = true;
        self.image_failures = 0;
        self.instance = instance;
        self.image_id = image_id;
        self.ready = false;
        self.started = false;
        self.state = State::Running {
            pid,
            started_at: super::process::now(),
            since: Instant::now(),
            kill_at: None,
        };
    }

    /// Records an exit (or a start that failed like one); returns the back-off delay when the
    /// container will be restarted.
    pub fn on_exit(
        &mut self,
        exit: &ExitInfo,
        message: Option<String>,
        container_id: Option<String>,
    ) -> Option<Duration> {
        let (started_at, ran_for) = match &self.state {
            State::Running {
                started_at, since, ..
            } => (Some(*started_at), since.elapsed()),
            _ => (None, Duration::ZERO),
        };
        let record = ContainerStateTerminated {
            exit_code: exit.code,
            signal: exit.signal,
            reason: Some(if exit.code == 0 { "Completed" } else { "Error" }.to_string()),
            message,
            started_at: started_at.or(Some(exit.at)).map(Time),
            finished_at: Some(Time(exit.at)),
            container_id,
        };
        self.ready = false;
        self.started = false;
        self.probes = None;
        if !self.stopping && self.policy.restarts(exit.code) {
            let delay = self.backoff.delay_after(ran_for);
            let message = format!(
                "back-off {}s restarting failed container={}",
                delay.as_secs(),
                self.name
            );
            self.last_terminated = Some(record);
            self.state = State::BackOff {
                until: Instant::now() + delay,
                message,
            };
            Some(delay)
        } else {
            self.state = State::Terminated(record);
            None
        }
    }

    /// Records a process that could not be started: terminated with exit code 128 (StartError).
    pub fn on_start_error(&mut self, message: String) -> Option<Duration> {
        self.ever_started = true;
        let exit = ExitInfo {
            code: 128,
            signal: None,
            at: super::process::now(),
        };
        let delay = self.on_exit(&exit, Some(message), None);
        let retag = |t: &mut ContainerStateTerminated| t.reason = Some("StartError".into());
        match &mut self.state {
            State::Terminated(t) => retag(t),
            _ => {
                if let Some(t) = self.last_terminated.as_mut() {
                    retag(t);
                }
            }
        }
        delay
    }

    /// Whether the container finished for good (terminated, no restart coming).
    pub fn finished(&self) -> Option<i32> {
        match &self.state {
            State::Terminated(t) => Some(t.exit_code),
            _ => None,
        }
    }

    /// Marks a container that is not running as terminated for good because the pod (or, for a
    /// sidecar, the pod's main work) stopped.
    pub fn abandon(&mut self) {
        if !matches!(self.state, State::Waiting { .. } | State::BackOff { .. }) {
            return;
        }
        let terminated = match &self.last_terminated {
            // Waiting to restart: it stays as its last run ended.
            Some(last) => last.clone(),
            None => {
                let now = Time(super::process::now());
                ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("ContainerStatusUnknown".into()),
                    message: Some("The container could not be located when the pod was terminated".into()),
                    finished_at: Some(now.clone()),
                    started_at: Some(now),
                    ..Default::default()
                }
            }
        };
        self.state = State::Terminated(terminated);
    }

    /// The API status of this container.
    pub fn status(&self) -> ContainerStatus {
        let state = match &self.state {
            State::Waiting { reason, message, .. } => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..Default::default()
            },
            State::BackOff { message, .. } => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("CrashLoopBackOff".into()),
                    message: Some(message.clone()),
                }),
                ..Default::default()
            },
            State::Running { started_at, .. } => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(*started_at)),
                }),
                ..Default::default()
            },
            State::Terminated(t) => ContainerState {
                terminated: Some(t.clone()),
                ..Default::default()
            },
        };
        let container_id = match &self.state {
            State::Running { pid, .. } => Some(format!("mf-process://{pid}")),
            State::Terminated(t) => t.container_id.clone(),
            _ => None,
        };
        let running = self.is_running();
        ContainerStatus {
            name: self.name.clone(),
            image: self.image.clone(),
            image_id: self.image_id.clone(),
            container_id,
            ready: running && self.ready,
            started: Some(running && self.started),
            restart_count: self.restart_count,
            state: Some(state),
            last_state: Some(ContainerState {
                terminated: self.last_terminated.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut b = Backoff::default();
        let s = Duration::from_secs;
        let delays: Vec<u64> = (0..8).map(|_| b.delay_after(s(1)).as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(b.delay_after(s(60)), s(1));
        assert_eq!(b.delay_after(s(59)), s(2));
    }

    fn exit(code: i32) -> ExitInfo {
        ExitInfo {
            code,
            signal: None,
            at: Timestamp::UNIX_EPOCH,
        }
    }

    fn check(kind: Kind, pod: RestartPolicy, exits: &[i32], expected: (&str, i32, Option<i32>)) {
        let container = Container {
            name: "c".into(),
            ..Default::default()
        };
        let mut c = ContainerRt::new(&container, kind, pod, false);
        for (i, code) in exits.iter().enumerate() {
            c.on_started(100 + i as u32, i as u64, "img".into());
            if c.on_exit(&exit(*code), None, None).is_some() {
                c.state = State::Waiting {
                    reason: "x".into(),
                    message: None,
                    retry_at: None,
                };
            }
        }
        let status = c.status();
        let state = status.state.unwrap();
        let shown = if state.terminated.is_some() {
            "terminated"
        } else {
            "waiting"
        };
        let last = status.last_state.and_then(|s| s.terminated).map(|t| t.exit_code);
        assert_eq!(
            (shown, status.restart_count, last),
            expected,
            "{kind:?} {pod:?} {exits:?}"
        );
    }

    #[test]
    fn restart_policies_apply_per_kind() {
        use Kind::*;
        use RestartPolicy::*;
        check(Regular, Always, &[0, 1, 0], ("waiting", 2, Some(0)));
        check(Regular, OnFailure, &[1, 0], ("terminated", 1, Some(1)));
        check(Regular, Never, &[1], ("terminated", 0, None));
        check(Init, Always, &[1, 1, 0], ("terminated", 2, Some(1)));
        check(Init, Never, &[1], ("terminated", 0, None));
        check(Sidecar, Never, &[0, 0], ("waiting", 1, Some(0)));
    }

    #[test]
    fn stopping_containers_do_not_restart_and_status_shows_back_off() {
        let container = Container {
            name: "c".into(),
            image: Some("i".into()),
            ..Default::default()
        };
        let mut c = ContainerRt::new(&container, Kind::Regular, RestartPolicy::Always, false);
        c.on_started(42, 1, "img".into());
        assert_eq!(c.status().container_id.as_deref(), Some("mf-process://42"));
        assert!(
            c.on_exit(&exit(2), Some("boom".into()), Some("mf-process://42".into()))
                .is_some()
        );
        let waiting = c.status().state.unwrap().waiting.unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
        c.on_started(43, 2, "img".into());
        c.stopping = true;
        assert!(c.on_exit(&exit(143), None, None).is_none());
        assert_eq!(c.finished(), Some(143));
        let mut fresh = ContainerRt::new(&container, Kind::Regular, RestartPolicy::Always, true);
        assert_eq!(
            fresh.status().state.unwrap().waiting.unwrap().reason.as_deref(),
            Some("PodInitializing")
        );
        assert!(fresh.on_start_error("exec: nope".into()).is_some());
        let last = fresh.status().last_state.unwrap().terminated.unwrap();
        assert_eq!(
            (last.exit_code, last.reason.as_deref()),
            (128, Some("StartError"))
        );
    }
}
