//! The weight walk, table by table: a good canary through every step, a failure at each kind of
//! step, manual gates, aborts, reverts, and what must never happen (a pass without evidence, a retry
//! of a rolled-back revision, a stale annotation acting on a later rollout).

use super::analysis::{Figures, Verdict};
use super::walk::{Inputs, Next, next};
use k8s_openapi::jiff::Timestamp;
use modelfleet_crds::rollout::{
    MirrorSpec, RolloutGate, RolloutPhase, RolloutSpec, RolloutStatus, RolloutStep, RolloutStrategy,
};

fn spec(mirror: bool) -> RolloutSpec {
    let timed = |w, p: &str| RolloutStep {
        weight: w,
        pause: Some(p.into()),
        gate: None,
    };
    RolloutSpec {
        strategy: RolloutStrategy::Canary,
        steps: vec![timed(10, "60s"), timed(50, "60s"), timed(100, "30s")],
        analysis: None,
        mirror: mirror.then(|| MirrorSpec {
            percent: 20,
            pause: "30s".into(),
        }),
    }
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn pass() -> Option<Verdict> {
    Some(Verdict::Pass(Figures {
        canary_requests: 60.0,
        stable_requests: 500.0,
        ttft_ratio: Some(1.0),
        ..Default::default()
    }))
}

fn fail() -> Option<Verdict> {
    Some(Verdict::Fail {
        threshold: "error rate 30.00% over 20 requests exceeds stable's 0.00% + 1 points".into(),
        figures: Figures {
            canary_requests: 20.0,
            canary_error_percent: 30.0,
            ..Default::default()
        },
    })
}

struct Walk {
    spec: RolloutSpec,
    status: Option<RolloutStatus>,
    events: Vec<&'static str>,
}

impl Walk {
    fn new(spec: RolloutSpec) -> Self {
        let mut w = Self {
            spec,
            status: None,
            events: vec![],
        };
        w.go("r1", 0, false, None);
        w
    }

    fn go(&mut self, desired: &str, t: i64, ready: bool, verdict: Option<Verdict>) -> &RolloutStatus {
        self.go_with(desired, t, ready, verdict, None, None)
    }

    fn go_with(
        &mut self,
        desired: &str,
        t: i64,
        ready: bool,
        verdict: Option<Verdict>,
        promote: Option<&str>,
        abort: Option<&str>,
    ) -> &RolloutStatus {
        let i = Inputs {
            spec: &self.spec,
            desired,
            now: at(t),
            canary_ready: ready,
            old_gone: ready,
            verdict,
            promote,
            abort,
        };
        let Next { status, event } = next(self.status.as_ref(), &i);
        if let Some((reason, _)) = event {
            self.events.push(reason);
        }
        self.status = Some(status);
        self.status.as_ref().unwrap()
    }
}

fn phase_weight(s: &RolloutStatus) -> (RolloutPhase, i32, Option<i32>) {
    (s.phase, s.weight, s.step)
}

#[test]
fn first_sight_makes_what_runs_stable() {
    let w = Walk::new(spec(false));
    let s = w.status.as_ref().unwrap();
    assert_eq!(
        (s.stable_revision.as_str(), s.canary_revision.as_deref(), s.phase),
        ("r1", None, RolloutPhase::Stable)
    );
    assert!(w.events.is_empty());
}

#[test]
fn a_good_canary_walks_every_step_and_becomes_stable() {
    let mut w = Walk::new(spec(false));
    assert_eq!(
        phase_weight(w.go("r2", 0, false, None)),
        (RolloutPhase::Starting, 0, None)
    );
    // Not Ready: no traffic.
    assert_eq!(
        phase_weight(w.go("r2", 30, false, None)),
        (RolloutPhase::Starting, 0, None)
    );
    assert_eq!(
        phase_weight(w.go("r2", 40, true, None)),
        (RolloutPhase::Progressing, 10, Some(0))
    );
    // A pass before the pause elapsed does not move the step.
    assert_eq!(
        phase_weight(w.go("r2", 60, true, pass())),
        (RolloutPhase::Progressing, 10, Some(0))
    );
    assert_eq!(
        phase_weight(w.go("r2", 100, true, pass())),
        (RolloutPhase::Progressing, 50, Some(1))
    );
    assert_eq!(
        phase_weight(w.go("r2", 160, true, pass())),
        (RolloutPhase::Progressing, 100, Some(2))
    );
    assert_eq!(
        phase_weight(w.go("r2", 190, true, pass())),
        (RolloutPhase::Promoting, 100, None)
    );
    let s = w.go("r2", 200, true, None).clone();
    assert_eq!(
        (s.stable_revision.as_str(), s.canary_revision, s.phase, s.weight),
        ("r2", None, RolloutPhase::Stable, 0)
    );
    assert_eq!(
        s.steps
            .iter()
            .map(|a| (a.weight, a.verdict.as_str()))
            .collect::<Vec<_>>(),
        [(10, "Passed"), (50, "Passed"), (100, "Passed")]
    );
    assert_eq!(
        w.events,
        [
            "RolloutStarted",
            "RolloutStep",
            "RolloutStep",
            "RolloutStep",
            "RolloutPromoted"
        ]
    );
}

#[test]
fn too_little_evidence_holds_the_step_however_long() {
    let mut w = Walk::new(spec(false));
    w.go("r2", 0, false, None);
    w.go("r2", 1, true, None);
    for t in [61, 600, 6000] {
        let s = w.go(
            "r2",
            t,
            true,
            Some(Verdict::Wait(
                "12 of the 50 canary requests needed to judge".into(),
            )),
        );
        assert_eq!(phase_weight(s), (RolloutPhase::Progressing, 10, Some(0)));
        assert!(s.message.contains("12 of the 50"), "{}", s.message);
    }
    assert_eq!(
        phase_weight(w.go("r2", 6001, true, None)),
        (RolloutPhase::Progressing, 10, Some(0))
    );
}

#[test]
fn a_failed_analysis_rolls_back_at_once_and_the_revision_is_not_retried() {
    let mut w = Walk::new(spec(false));
    w.go("r2", 0, false, None);
    w.go("r2", 1, true, None);
    w.go("r2", 70, true, pass());
    // Failing mid-step, before its pause is over.
    let s = w.go("r2", 80, true, fail()).clone();
    assert_eq!(phase_weight(&s), (RolloutPhase::RolledBack, 0, None));
    assert_eq!(
        (s.stable_revision.as_str(), s.canary_revision.as_deref()),
        ("r1", Some("r2"))
    );
    assert!(
        s.message.contains("step 2") && s.message.contains("error rate 30.00%"),
        "{}",
        s.message
    );
    assert_eq!(s.steps.last().unwrap().verdict, "Failed");
    assert_eq!(s.steps.last().unwrap().canary_error_percent, "30.00");
    assert_eq!(w.events.last(), Some(&"RolledBack"));
    // The same revision stays rolled back, passes or not.
    assert_eq!(w.go("r2", 500, true, pass()).phase, RolloutPhase::RolledBack);
    // Git revert: back to plain stable, no canary.
    let s = w.go("r1", 600, true, None);
    assert_eq!(
        (s.phase, s.canary_revision.as_deref(), s.stable_revision.as_str()),
        (RolloutPhase::Stable, None, "r1")
    );
    // A fixed revision starts a new rollout.
    assert_eq!(w.go("r3", 700, false, None).phase, RolloutPhase::Starting);
}

#[test]
fn the_shadow_step_comes_first_and_can_fail() {
    let mut w = Walk::new(spec(true));
    w.go("r2", 0, false, None);
    let s = w.go("r2", 5, true, None);
    assert_eq!(
        (s.phase, s.weight, s.mirror_percent),
        (RolloutPhase::Mirroring, 0, 20)
    );
    let s = w.go("r2", 40, true, pass());
    assert_eq!(
        (s.phase, s.weight, s.mirror_percent, s.step),
        (RolloutPhase::Progressing, 10, 0, Some(0))
    );
    assert_eq!(s.steps[0].step, -1);
    assert_eq!(s.steps[0].weight, 20);

    let mut w = Walk::new(spec(true));
    w.go("r2", 0, false, None);
    w.go("r2", 5, true, None);
    let s = w.go("r2", 10, true, fail());
    assert_eq!(
        (s.phase, s.weight, s.mirror_percent),
        (RolloutPhase::RolledBack, 0, 0)
    );
    assert!(s.message.contains("shadow step"), "{}", s.message);
}

#[test]
fn a_manual_gate_holds_until_the_revision_is_named() {
    let mut sp = spec(false);
    sp.steps[1] = RolloutStep {
        weight: 50,
        pause: None,
        gate: Some(RolloutGate::Manual),
    };
    let mut w = Walk::new(sp);
    w.go("r2", 0, false, None);
    w.go("r2", 1, true, None);
    let s = w.go("r2", 70, true, pass());
    assert_eq!(phase_weight(s), (RolloutPhase::Paused, 50, Some(1)));
    assert!(s.message.contains("modelfleet.io/promote=r2"), "{}", s.message);
    // Time and passes alone do not open it; an annotation naming another revision does not either.
    assert_eq!(w.go("r2", 9000, true, pass()).phase, RolloutPhase::Paused);
    assert_eq!(
        w.go_with("r2", 9001, true, pass(), Some("r1"), None).phase,
        RolloutPhase::Paused
    );
    assert_eq!(
        phase_weight(w.go_with("r2", 9002, true, pass(), Some("r2"), None)),
        (RolloutPhase::Progressing, 100, Some(2))
    );
    // A failure at a gate still rolls back.
    let mut w2 = Walk {
        spec: w.spec.clone(),
        status: None,
        events: vec![],
    };
    w2.go("r1", 0, false, None);
    w2.go("r2", 0, false, None);
    w2.go("r2", 1, true, None);
    w2.go("r2", 70, true, pass());
    assert_eq!(w2.go("r2", 80, true, fail()).phase, RolloutPhase::RolledBack);
}

#[test]
fn abort_needs_the_canary_revision_and_withdraws_it() {
    let mut w = Walk::new(spec(false));
    w.go("r2", 0, false, None);
    w.go("r2", 1, true, None);
    assert_eq!(
        w.go_with("r2", 5, true, None, None, Some("r9")).phase,
        RolloutPhase::Progressing
    );
    let s = w.go_with("r2", 6, true, None, None, Some("r2")).clone();
    assert_eq!(phase_weight(&s), (RolloutPhase::Aborted, 0, None));
    assert_eq!(w.events.last(), Some(&"RolloutAborted"));
    // A stale abort annotation does not touch the next revision.
    assert_eq!(
        w.go_with("r3", 10, false, None, None, Some("r2")).phase,
        RolloutPhase::Starting
    );
    assert_eq!(
        w.go_with("r3", 11, true, None, None, Some("r2")).phase,
        RolloutPhase::Progressing
    );
}

#[test]
fn a_new_change_mid_rollout_starts_over_and_a_revert_withdraws_cleanly() {
    let mut w = Walk::new(spec(false));
    w.go("r2", 0, false, None);
    w.go("r2", 1, true, None);
    w.go("r2", 70, true, pass());
    let s = w.go("r3", 75, false, None);
    assert_eq!(
        (
            s.phase,
            s.canary_revision.as_deref(),
            s.weight,
            s.stable_revision.as_str()
        ),
        (RolloutPhase::Starting, Some("r3"), 0, "r1")
    );
    w.go("r3", 76, true, None);
    let s = w.go("r1", 80, true, None);
    assert_eq!(
        (s.phase, s.canary_revision.as_deref(), s.weight),
        (RolloutPhase::Stable, None, 0)
    );
    assert!(s.message.contains("canary r3 withdrawn"), "{}", s.message);
    assert_eq!(w.events.last(), Some(&"RolloutAborted"));
}

#[test]
fn promotion_waits_for_the_old_pods_to_go() {
    let mut w = Walk::new(spec(false));
    w.spec.steps.truncate(1);
    w.go("r2", 0, false, None);
    w.go("r2", 1, true, None);
    w.go("r2", 70, true, pass());
    let i = Inputs {
        spec: &w.spec,
        desired: "r2",
        now: at(80),
        canary_ready: true,
        old_gone: false,
        verdict: None,
        promote: None,
        abort: None,
    };
    let held = next(w.status.as_ref(), &i);
    assert_eq!(phase_weight(&held.status), (RolloutPhase::Promoting, 100, None));
    // An abort annotation no longer applies once promoting.
    let i = Inputs {
        abort: Some("r2"),
        ..i
    };
    assert_eq!(next(w.status.as_ref(), &i).status.phase, RolloutPhase::Promoting);
}
