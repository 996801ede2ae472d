//! The weight walk (pure): from the previous `status.rollout`, the revision the spec asks for, the
//! canary's readiness, the window's verdict and the annotations, the next `status.rollout` and the
//! Event the change deserves.
//!
//! ```text
//! Stable ──spec names a new revision──▶ Starting ──canary Ready──▶ Mirroring (with spec.mirror)
//!                                                                    │ passed its pause
//!                                                                    ▼
//!                     Progressing(step i) ⇄ Paused(manual gate) ──last step passed──▶ Promoting
//!                                                                                      │ old pods gone
//!   any step: analysis failed ─▶ RolledBack      abort annotation ─▶ Aborted           ▼
//!   spec back at stable ─▶ Stable (canary withdrawn)                                 Stable
//! ```
//!
//! Invariants: a timed step moves on only with a `Pass` of its window once its pause elapsed (a `Wait`
//! holds it: too little evidence never passes); a `Fail` in any phase with traffic rolls back at once;
//! a RolledBack or Aborted revision is never retried until the spec names another revision; the
//! promote and abort annotations act only when their value is the canary's revision, so one left
//! behind never approves or aborts a later rollout; the walk never touches the spec.

use super::analysis::{Figures, Verdict};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use modelfleet_crds::rollout::{RolloutPhase, RolloutSpec, RolloutStatus, StepAnalysis};
use std::time::Duration;

/// What the walk reads, besides the previous status.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    pub spec: &'a RolloutSpec,
    /// The revision the spec asks for now.
    pub desired: &'a str,
    pub now: Timestamp,
    /// The canary's pods are Ready (digest verified) and can take traffic.
    pub canary_ready: bool,
    /// The previous stable revision's pods are all gone (promotion finished retiring them).
    pub old_gone: bool,
    /// The analysis of the running step's window (`None`: nothing measured yet).
    pub verdict: Option<Verdict>,
    /// The values of the promote and abort annotations.
    pub promote: Option<&'a str>,
    pub abort: Option<&'a str>,
}

/// The next status and the Event (reason, message) for a change, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct Next {
    pub status: RolloutStatus,
    pub event: Option<(&'static str, String)>,
}

fn step_pause(spec: &RolloutSpec, step: i32) -> Option<Duration> {
    let s = spec.steps.get(usize::try_from(step).ok()?)?;
    modelfleet_crds::autoscaling::parse_duration(s.pause.as_deref()?).ok()
}

fn elapsed(status: &RolloutStatus, now: Timestamp) -> Duration {
    let since = status.step_started_at.as_ref().map_or(now, |t| t.0);
    now.duration_since(since).try_into().unwrap_or_default()
}

/// A figure rounded to `d` decimals, as text.
fn fixed(x: f64, d: usize) -> String {
    format!("{x:.d$}")
}

fn sig3(x: f64) -> String {
    if !x.is_finite() {
        return "inf".into();
    }
    let digits = if x == 0.0 {
        0
    } else {
        (2 - x.abs().log10().floor() as i32).max(0) as usize
    };
    format!("{x:.digits$}")
}

fn record(status: &RolloutStatus, verdict: &str, f: &Figures, now: Timestamp) -> StepAnalysis {
    StepAnalysis {
        step: status.step.unwrap_or(-1),
        weight: if status.phase == RolloutPhase::Mirroring {
            status.mirror_percent
        } else {
            status.weight
        },
        verdict: verdict.into(),
        canary_requests: f.canary_requests as i64,
        stable_requests: f.stable_requests as i64,
        canary_error_percent: fixed(f.canary_error_percent, 2),
        stable_error_percent: fixed(f.stable_error_percent, 2),
        ttft_p95_ratio: f.ttft_ratio.map(sig3),
        itl_p95_ratio: f.itl_ratio.map(sig3),
        decided_at: Some(Time(now)),
    }
}

fn push(steps: &mut Vec<StepAnalysis>, a: StepAnalysis) {
    steps.push(a);
    let excess = steps.len().saturating_sub(12);
    steps.drain(..excess);
}

/// Enters step `i` (or Promoting past the last one).
fn enter_step(mut s: RolloutStatus, spec: &RolloutSpec, i: i32, now: Timestamp) -> Next {
    s.step_started_at = Some(Time(now));
    s.mirror_percent = 0;
    let canary = s.canary_revision.clone().unwrap_or_default();
    match spec.steps.get(i as usize) {
        Some(step) => {
            s.step = Some(i);
            s.weight = step.weight;
            s.phase = if step.gate.is_some() {
                RolloutPhase::Paused
            } else {
                RolloutPhase::Progressing
            };
            s.message = match step.gate {
                Some(_) => format!(
                    "step {} at {}%: holds until annotated {}={canary}",
                    i + 1,
                    step.weight,
                    modelfleet_crds::rollout::PROMOTE_ANNOTATION
                ),
                None => format!(
                    "step {} at {}% for {}",
                    i + 1,
                    step.weight,
                    step.pause.as_deref().unwrap_or("")
                ),
            };
            let msg = format!("canary {canary}: {}", s.message);
            Next {
                status: s,
                event: Some(("RolloutStep", msg)),
            }
        }
        None => {
            s.step = None;
            s.weight = 100;
            s.phase = RolloutPhase::Promoting;
            s.message =
                format!("every step passed: {canary} takes all traffic; the previous pods are retired");
            let msg = format!("canary {canary} promoted");
            Next {
                status: s,
                event: Some(("RolloutPromoted", msg)),
            }
        }
    }
}

fn withdrawn(mut s: RolloutStatus, phase: RolloutPhase, message: String, reason: &'static str) -> Next {
    s.phase = phase;
    s.weight = 0;
    s.mirror_percent = 0;
    s.step = None;
    s.message = message.clone();
    Next {
        status: s,
        event: Some((reason, message)),
    }
}

/// The next rollout status.
pub fn next(previous: Option<&RolloutStatus>, i: &Inputs) -> Next {
    let unchanged = |s: &RolloutStatus| Next {
        status: s.clone(),
        event: None,
    };
    let Some(prev) = previous.filter(|p| !p.stable_revision.is_empty()) else {
        // First sight: what runs now is stable.
        let status = RolloutStatus {
            stable_revision: i.desired.into(),
            ..Default::default()
        };
        return Next { status, event: None };
    };
    let canary = prev.canary_revision.as_deref();
    let in_flight = !matches!(
        prev.phase,
        RolloutPhase::Stable | RolloutPhase::RolledBack | RolloutPhase::Aborted
    );
    // The spec went back to stable: withdraw any canary.
    if i.desired == prev.stable_revision {
        if canary.is_none() && prev.phase == RolloutPhase::Stable {
            return unchanged(prev);
        }
        return reverted(prev, in_flight);
    }
    // A revision that failed or was aborted holds until the spec names another one.
    if Some(i.desired) == canary && !in_flight {
        return unchanged(prev);
    }
    // A new revision (also mid-rollout: the newest change wins and starts over).
    if Some(i.desired) != canary {
        return started(prev, i);
    }
    let c = i.desired;
    if i.abort == Some(c) && prev.phase != RolloutPhase::Promoting {
        let msg = format!(
            "canary {c} aborted by the {} annotation",
            modelfleet_crds::rollout::ABORT_ANNOTATION
        );
        return withdrawn(prev.clone(), RolloutPhase::Aborted, msg, "RolloutAborted");
    }
    match prev.phase {
        RolloutPhase::Starting if i.canary_ready => match &i.spec.mirror {
            Some(m) => mirroring(prev, m, c, i.now),
            None => enter_step(prev.clone(), i.spec, 0, i.now),
        },
        RolloutPhase::Mirroring | RolloutPhase::Progressing | RolloutPhase::Paused => judged(prev, i),
        RolloutPhase::Promoting if i.old_gone => {
            let s = RolloutStatus {
                stable_revision: c.into(),
                steps: prev.steps.clone(),
                message: format!("{c} is stable"),
                ..Default::default()
            };
            Next {
                status: s,
                event: None,
            }
        }
        _ => unchanged(prev),
    }
}

/// The spec names the stable revision again: back to plain stable, any canary withdrawn.
fn reverted(prev: &RolloutStatus, in_flight: bool) -> Next {
    let canary = prev.canary_revision.as_deref();
    let mut s = RolloutStatus {
        stable_revision: prev.stable_revision.clone(),
        steps: prev.steps.clone(),
        ..Default::default()
    };
    s.message = match (in_flight, canary) {
        (true, Some(c)) => format!(
            "the spec returned to {}: canary {c} withdrawn",
            prev.stable_revision
        ),
        _ => String::new(),
    };
    let event = (in_flight && canary.is_some()).then(|| ("RolloutAborted", s.message.clone()));
    Next { status: s, event }
}

/// A new revision starts beside stable (figures of an earlier rollout are dropped).
fn started(prev: &RolloutStatus, i: &Inputs) -> Next {
    let s = RolloutStatus {
        stable_revision: prev.stable_revision.clone(),
        canary_revision: Some(i.desired.into()),
        phase: RolloutPhase::Starting,
        step_started_at: Some(Time(i.now)),
        message: format!("canary {} starting beside {}", i.desired, prev.stable_revision),
        ..Default::default()
    };
    let event = Some(("RolloutStarted", s.message.clone()));
    Next { status: s, event }
}

/// The shadow step begins.
fn mirroring(
    prev: &RolloutStatus,
    m: &modelfleet_crds::rollout::MirrorSpec,
    c: &str,
    now: Timestamp,
) -> Next {
    let mut s = prev.clone();
    s.phase = RolloutPhase::Mirroring;
    s.mirror_percent = m.percent;
    s.step_started_at = Some(Time(now));
    s.message = format!(
        "shadow: {}% of stable's requests copied to {c} for {}",
        m.percent, m.pause
    );
    let msg = s.message.clone();
    Next {
        status: s,
        event: Some(("RolloutMirroring", msg)),
    }
}

/// A phase with traffic (or copies) on the canary: fail, hold, or move on.
fn judged(prev: &RolloutStatus, i: &Inputs) -> Next {
    let c = i.desired;
    if let Some(Verdict::Fail { threshold, figures }) = &i.verdict {
        let mut s = prev.clone();
        push(&mut s.steps, record(prev, "Failed", figures, i.now));
        let msg = format!(
            "canary {c} rolled back at {}% ({}): {threshold}",
            s.weight.max(s.mirror_percent),
            match prev.step {
                Some(n) => format!("step {}", n + 1),
                None => "shadow step".into(),
            }
        );
        return withdrawn(s, RolloutPhase::RolledBack, msg, "RolledBack");
    }
    let next_index = prev.step.map_or(0, |n| n + 1);
    let pass = |mut s: RolloutStatus, f: Option<&Figures>| {
        if let Some(f) = f {
            push(&mut s.steps, record(prev, "Passed", f, i.now));
        }
        enter_step(s, i.spec, next_index, i.now)
    };
    let figures = match &i.verdict {
        Some(Verdict::Pass(f)) => Some(f),
        _ => None,
    };
    if prev.phase == RolloutPhase::Paused {
        // A person's approval moves a manual gate; the analysis can still fail it meanwhile.
        if i.promote == Some(c) {
            return pass(prev.clone(), figures);
        }
        return Next {
            status: prev.clone(),
            event: None,
        };
    }
    let pause = match prev.phase {
        RolloutPhase::Mirroring => i
            .spec
            .mirror
            .as_ref()
            .and_then(|m| modelfleet_crds::autoscaling::parse_duration(&m.pause).ok()),
        _ => step_pause(i.spec, prev.step.unwrap_or(0)),
    }
    .unwrap_or_default();
    if elapsed(prev, i.now) < pause {
        return Next {
            status: prev.clone(),
            event: None,
        };
    }
    match &i.verdict {
        Some(Verdict::Pass(f)) => pass(prev.clone(), Some(f)),
        Some(Verdict::Wait(why)) => {
            let mut s = prev.clone();
            s.message = format!("waiting to judge canary {c}: {why}");
            Next {
                status: s,
                event: None,
            }
        }
        _ => {
            let mut s = prev.clone();
            s.message = format!("waiting to judge canary {c}: no measurement yet");
            Next {
                status: s,
                event: None,
            }
        }
    }
}
