//! Pod phase and conditions, computed from container statuses as the kubelet computes them.
//!
//! Port of the kubelet's `getPhase` (without the alpha container restart rules) and of
//! `status.Generate*Condition`. Pure functions: container statuses and a few pod facts in, phase
//! and conditions out.
//!
//! Invariants: a condition's `lastTransitionTime` changes only when its status changes (it is
//! carried over from the previous conditions otherwise); conditions the kubelet does not own
//! (e.g. `DisruptionTarget`) are kept as they are; a terminal phase never goes back.

use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The pod restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Restart on any exit.
    Always,
    /// Restart on non-zero exits.
    OnFailure,
    /// Never restart.
    Never,
}

impl RestartPolicy {
    /// Parses the spec value; anything unknown counts as `Always` (the API default).
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            _ => RestartPolicy::Always,
        }
    }

    /// Whether a container that exited with `exit_code` is restarted.
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// What phase and conditions are computed from.
#[derive(Debug, Clone)]
pub struct PodFacts<'a> {
    /// The pod's restart policy.
    pub restart_policy: RestartPolicy,
    /// Statuses of the init containers, in spec order.
    pub init: &'a [ContainerStatus],
    /// Which init containers are sidecars (`restartPolicy: Always`), same order.
    pub sidecar: &'a [bool],
    /// Statuses of the regular containers, in spec order.
    pub containers: &'a [ContainerStatus],
    /// Whether the pod's directory, IP and volumes are set up.
    pub sandbox_ready: bool,
    /// Whether the pod is terminal: being deleted with all processes stopped.
    pub terminal: bool,
    /// Whether a regular container has ever run (the pod was initialised once).
    pub initialized_once: bool,
}

/// The phase.
pub fn phase(f: &PodFacts<'_>) -> &'static str {
    let terminated_code = |s: &ContainerStatus| {
        s.state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .map(|t| t.exit_code)
    };
    let running = |s: &ContainerStatus| s.state.as_ref().is_some_and(|st| st.running.is_some());
    let waiting = |s: &ContainerStatus| s.state.as_ref().is_none_or(|st| st.waiting.is_some());
    let last_code = |s: &ContainerStatus| {
        s.last_state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .map(|t| t.exit_code)
    };

    let (mut pending_init, mut pending_sidecars, mut failed_init) = (0, 0, 0);
    let (mut running_n, mut waiting_n, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for (s, &sidecar) in f.init.iter().zip(f.sidecar) {
        if sidecar {
            if running(s) {
                if s.started != Some(true) {
                    pending_sidecars += 1;
                }
                running_n += 1;
            } else if waiting(s) && last_code(s).is_none() {
                pending_sidecars += 1;
                waiting_n += 1;
            }
            continue;
        }
        match (terminated_code(s), running(s)) {
            (Some(0), _) => {}
            (Some(_), _) => failed_init += 1,
            (None, true) => pending_init += 1,
            (None, false) => match last_code(s) {
                Some(0) | None => pending_init += 1,
                Some(_) => failed_init += 1,
            },
        }
    }
    for s in f.containers {
        if running(s) {
            running_n += 1;
        } else if let Some(code) = terminated_code(s) {
            stopped += 1;
            if code == 0 {
                succeeded += 1;
            }
        } else if last_code(s).is_some() {
            stopped += 1;
        } else {
            waiting_n += 1;
        }
    }
    if failed_init > 0 && f.restart_policy == RestartPolicy::Never {
        return "Failed";
    }
    if pending_init > 0 || (pending_sidecars > 0 && !f.initialized_once) || waiting_n > 0 {
        return "Pending";
    }
    if running_n > 0 {
        return "Running";
    }
    if stopped > 0 {
        if f.terminal {
            return if stopped == succeeded {
                "Succeeded"
            } else {
                "Failed"
            };
        }
        return match f.restart_policy {
            RestartPolicy::Always => "Running",
            _ if stopped == succeeded => "Succeeded",
            RestartPolicy::Never => "Failed",
            RestartPolicy::OnFailure => "Running",
        };
    }
    "Pending"
}

/// Whether a phase is terminal.
pub fn is_terminal(phase: &str) -> bool {
    phase == "Succeeded" || phase == "Failed"
}

/// The kubelet-owned conditions, merged into `previous` (others kept), with transition times
/// carried over where the status did not change.
pub fn conditions(f: &PodFacts<'_>, phase: &str, previous: &[PodCondition], now: &Time) -> Vec<PodCondition> {
    let succeeded = phase == "Succeeded";
    let names = |pred: &dyn Fn(&ContainerStatus) -> bool, list: &[ContainerStatus]| -> Vec<String> {
        list.iter().filter(|s| pred(s)).map(|s| s.name.clone()).collect()
    };
    let init_done = |s: &ContainerStatus, sidecar: bool| {
        let st = s.state.as_ref();
        if sidecar {
            s.started == Some(true) || s.restart_count > 0 || st.is_some_and(|st| st.terminated.is_some())
        } else {
            st.and_then(|st| st.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        }
    };
    let incomplete: Vec<String> = f
        .init
        .iter()
        .zip(f.sidecar)
        .filter(|(s, sidecar)| !(init_done(s, **sidecar) || (f.initialized_once && **sidecar)))
        .map(|(s, _)| s.name.clone())
        .collect();
    let sidecars: Vec<ContainerStatus> = f
        .init
        .iter()
        .zip(f.sidecar)
        .filter(|(_, s)| **s)
        .map(|(c, _)| c.clone())
        .collect();
    let unready: Vec<String> = [
        names(&|s| !s.ready, &sidecars),
        names(&|s| !s.ready, f.containers),
    ]
    .concat();

    let mut owned = Vec::new();
    let cond = |type_: &str, ok: bool, reason: Option<&str>, message: Option<String>| PodCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: if ok && !succeeded {
            None
        } else {
            reason.map(str::to_string)
        },
        message: if ok { None } else { message },
        ..Default::default()
    };
    owned.push(cond(
        "PodReadyToStartContainers",
        f.sandbox_ready && !is_terminal(phase),
        None,
        None,
    ));
    let initialized = incomplete.is_empty() || succeeded;
    let init_reason = if succeeded {
        "PodCompleted"
    } else {
        "ContainersNotInitialized"
    };
    let init_msg = format!("containers with incomplete status: [{}]", incomplete.join(" "));
    owned.push(cond(
        "Initialized",
        initialized,
        Some(init_reason),
        Some(init_msg),
    ));
    let ready = unready.is_empty() && !is_terminal(phase) && !f.containers.is_empty();
    let (reason, message) = if succeeded {
        ("PodCompleted", None)
    } else {
        (
            "ContainersNotReady",
            Some(format!("containers with unready status: [{}]", unready.join(" "))),
        )
    };
    owned.push(cond("ContainersReady", ready, Some(reason), message.clone()));
    owned.push(cond("Ready", ready, Some(reason), message));
    owned.push(cond("PodScheduled", true, None, None));

    let mut out: Vec<PodCondition> = Vec::new();
    for mut c in owned {
        let prev = previous.iter().find(|p| p.type_ == c.type_);
        c.last_transition_time = match prev {
            Some(p) if p.status == c.status => p.last_transition_time.clone().or_else(|| Some(now.clone())),
            _ => Some(now.clone()),
        };
        out.push(c);
    }
    for p in previous {
        if !out.iter().any(|c| c.type_ == p.type_) {
            out.push(p.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    };
    use k8s_openapi::jiff::Timestamp;

    /// Compact container states: "w" waiting, "r" running, "r+" running and ready,
    /// "rs" running started (sidecar), "t0"/"t1" terminated with that code, "b1" waiting after a
    /// crash with exit code 1 (back-off).
    fn status(name: &str, code: &str) -> ContainerStatus {
        let mut s = ContainerStatus {
            name: name.into(),
            ..Default::default()
        };
        let terminated = |c: &str| ContainerStateTerminated {
            exit_code: c.parse().unwrap(),
            ..Default::default()
        };
        let state = match code {
            "w" => ContainerState {
                waiting: Some(ContainerStateWaiting::default()),
                ..Default::default()
            },
            "r" | "r+" | "rs" => {
                s.ready = code == "r+";
                s.started = Some(code != "r");
                ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                }
            }
            c if c.starts_with('t') => ContainerState {
                terminated: Some(terminated(&c[1..])),
                ..Default::default()
            },
            c if c.starts_with('b') => {
                s.last_state = Some(ContainerState {
                    terminated: Some(terminated(&c[1..])),
                    ..Default::default()
                });
                s.restart_count = 1;
                ContainerState {
                    waiting: Some(ContainerStateWaiting::default()),
                    ..Default::default()
                }
            }
            other => panic!("bad code {other}"),
        };
        s.state = Some(state);
        s
    }

    struct Case {
        policy: RestartPolicy,
        init: &'static [(&'static str, bool)],
        containers: &'static [&'static str],
        terminal: bool,
    }

    fn facts_check(case: Case, expected_phase: &str, expected: &[(&str, &str)]) {
        let init: Vec<ContainerStatus> = case
            .init
            .iter()
            .enumerate()
            .map(|(i, (c, _))| status(&format!("i{i}"), c))
            .collect();
        let sidecar: Vec<bool> = case.init.iter().map(|(_, s)| *s).collect();
        let containers: Vec<ContainerStatus> = case
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| status(&format!("c{i}"), c))
            .collect();
        let facts = PodFacts {
            restart_policy: case.policy,
            init: &init,
            sidecar: &sidecar,
            containers: &containers,
            sandbox_ready: true,
            terminal: case.terminal,
            initialized_once: false,
        };
        let phase = phase(&facts);
        assert_eq!(
            phase, expected_phase,
            "init {:?} containers {:?}",
            case.init, case.containers
        );
        let now = Time(Timestamp::UNIX_EPOCH);
        let got = conditions(&facts, phase, &[], &now);
        for (type_, want) in expected {
            let c = got.iter().find(|c| c.type_ == *type_).unwrap();
            assert_eq!(
                c.status, *want,
                "{type_} for init {:?} containers {:?}",
                case.init, case.containers
            );
        }
    }

    use RestartPolicy::*;

    #[test]
    fn phases_follow_the_kubelet() {
        let c = |policy, init, containers| Case {
            policy,
            init,
            containers,
            terminal: false,
        };
        facts_check(
            c(Always, &[("r", false)], &["w"]),
            "Pending",
            &[("Initialized", "False"), ("Ready", "False")],
        );
        facts_check(
            c(Always, &[("t0", false), ("w", false)], &["w"]),
            "Pending",
            &[("Initialized", "False")],
        );
        facts_check(
            c(Always, &[("b1", false)], &["w"]),
            "Pending",
            &[("Initialized", "False")],
        );
        facts_check(
            c(Never, &[("t1", false)], &["w"]),
            "Failed",
            &[("Ready", "False")],
        );
        facts_check(c(OnFailure, &[("t1", false)], &["w"]), "Pending", &[]);
        facts_check(
            c(Always, &[("t0", false)], &["w"]),
            "Pending",
            &[("Initialized", "True")],
        );
        facts_check(
            c(Always, &[("t0", false)], &["r"]),
            "Running",
            &[("Initialized", "True"), ("Ready", "False")],
        );
        facts_check(
            c(Always, &[], &["r+", "r+"]),
            "Running",
            &[("ContainersReady", "True"), ("Ready", "True")],
        );
        facts_check(c(Always, &[], &["r+", "r"]), "Running", &[("Ready", "False")]);
        facts_check(c(Always, &[], &["r+", "b1"]), "Running", &[("Ready", "False")]);
        facts_check(c(Always, &[], &["b1"]), "Running", &[]);
        facts_check(c(Always, &[], &["t0"]), "Running", &[]);
        facts_check(
            c(OnFailure, &[], &["t0", "t0"]),
            "Succeeded",
            &[("Ready", "False"), ("Initialized", "True")],
        );
        facts_check(c(OnFailure, &[], &["t0", "b1"]), "Running", &[]);
        facts_check(c(Never, &[], &["t0", "t1"]), "Failed", &[("Ready", "False")]);
        facts_check(c(Never, &[], &["t0", "r+"]), "Running", &[]);
        facts_check(c(Never, &[], &["t0"]), "Succeeded", &[]);
        facts_check(
            c(Always, &[("rs", true)], &["r+"]),
            "Running",
            &[("Ready", "False"), ("Initialized", "True")],
        );
        facts_check(
            c(Always, &[("r", true)], &["w"]),
            "Pending",
            &[("Initialized", "False")],
        );
        facts_check(c(Never, &[("rs", true)], &["t0"]), "Running", &[]);
        let terminal = |containers| Case {
            policy: Always,
            init: &[],
            containers,
            terminal: true,
        };
        facts_check(
            terminal(&["t0", "t0"]),
            "Succeeded",
            &[("PodReadyToStartContainers", "False")],
        );
        facts_check(terminal(&["t0", "t143"]), "Failed", &[("Ready", "False")]);
    }

    #[test]
    fn transition_times_change_only_on_transitions() {
        let containers = [status("c", "r")];
        let facts = PodFacts {
            restart_policy: Always,
            init: &[],
            sidecar: &[],
            containers: &containers,
            sandbox_ready: true,
            terminal: false,
            initialized_once: true,
        };
        let t1 = Time(Timestamp::from_second(100).unwrap());
        let t2 = Time(Timestamp::from_second(200).unwrap());
        let mut previous = conditions(&facts, "Running", &[], &t1);
        previous.push(PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            ..Default::default()
        });
        let ready = [status("c", "r+")];
        let facts = PodFacts {
            containers: &ready,
            ..facts
        };
        let next = conditions(&facts, "Running", &previous, &t2);
        let at = |type_: &str| {
            next.iter()
                .find(|c| c.type_ == type_)
                .unwrap()
                .last_transition_time
                .clone()
        };
        assert_eq!(at("Ready"), Some(t2.clone()));
        assert_eq!(at("ContainersReady"), Some(t2));
        assert_eq!(at("Initialized"), Some(t1.clone()));
        assert_eq!(at("PodScheduled"), Some(t1));
        assert!(next.iter().any(|c| c.type_ == "DisruptionTarget"));
        let messages: Vec<_> = previous.iter().filter_map(|c| c.message.clone()).collect();
        assert_eq!(messages, vec!["containers with unready status: [c]"; 2]);
    }
}
