//! Autoscaling arithmetic, pure and table-tested.
//!
//! Recommendation = the largest of ceil(total waiting / target per replica), ceil(replicas × mean KV /
//! target KV) and the objectives' capacity model ([`super::objectives`]) — each where it is in force —
//! clamped to [max(min, 1), max] and to at most double the current count (scaling to and from zero is
//! `controller/zero.rs`'s, on the gateway's demand). A recommendation above the current count
//! must hold for the scale-up window (the count then goes to the lowest recommendation seen in it); one
//! below must hold for the scale-down window (the count goes to the highest seen) — the semantics of
//! HPA's stabilization windows, kept as O(1) state ([`AutoscalerState`]).
//!
//! The objectives' own scale-up is the exception: taken at once, without the up-window. Their model
//! already looks ahead (the arrival trend over a pod's lead time) and has its own hysteresis (up at a
//! 10% margin, down only at 25%, through the scale-down window); waiting the up-window on a rising
//! load is what lets the objective be violated before the replica arrives.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use modelfleet_crds::model_deployment::{AutoscalerState, AutoscalingSpec, ScalingCandidate};
use std::cmp::Ordering;

/// Fleet-wide figures from one metrics pass over the ready replicas.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Replicas whose metrics were read.
    pub replicas: i32,
    /// Requests waiting, summed.
    pub waiting: f64,
    /// Requests running, summed.
    pub running: f64,
    /// Mean KV-cache utilisation, 0–1.
    pub kv_mean: f64,
    /// With objectives: the capacity model's count and why (`None`: not measured yet, which holds).
    pub objectives: Option<(i32, String)>,
}

/// What one pass decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The replica count to run now.
    pub replicas: i32,
    /// Stabilization state to keep.
    pub state: AutoscalerState,
    /// Why, in words (also the Event and status message when the count changes).
    pub reason: String,
}

/// The clamped recommendation for `sample` with the fleet at `current` replicas, and why: the largest
/// count any target in force asks for (queue, KV cache, objectives).
pub fn recommend(sample: &Sample, spec: &AutoscalingSpec, current: i32) -> (i32, String) {
    let mut raw = 0;
    let mut why = Vec::new();
    if let Some(target) = spec.queue_target() {
        let by_queue = (sample.waiting / f64::from(target.max(1))).ceil() as i32;
        raw = raw.max(by_queue);
        why.push(format!(
            "queue {} / target {target} per replica -> {by_queue}",
            sample.waiting
        ));
    }
    if let Some(target) = spec.kv_target() {
        let by_kv = (f64::from(sample.replicas) * sample.kv_mean / target).ceil() as i32;
        raw = raw.max(by_kv);
        why.push(format!(
            "KV {:.0}% over {} replicas / target {:.0}% -> {by_kv}",
            sample.kv_mean * 100.0,
            sample.replicas,
            target * 100.0
        ));
    }
    if spec.objectives.is_some() {
        match &sample.objectives {
            Some((n, because)) => {
                raw = raw.max(*n);
                why.push(format!("objectives: {because} -> {n}"));
            }
            None => {
                raw = raw.max(current);
                why.push("objectives: not measured yet, holding".into());
            }
        }
    }
    // Never below 1 here: a deployment with `minReplicas: 0` reaches 0 only through its idle window
    // (controller/zero.rs), not because one sample looked idle.
    let floor = spec.min_replicas.max(1);
    let ceiling = spec.max_replicas.min((current.max(1)).saturating_mul(2));
    let clamped = raw.clamp(floor, ceiling.max(floor));
    (clamped, why.join("; "))
}

fn elapsed_secs(since: &Time, now: Timestamp) -> i64 {
    now.as_second() - since.0.as_second()
}

/// The objectives' own scale-up, taken at once (the module header says why): their count, clamped like
/// the recommendation `rec`, when it is above `current`.
fn objectives_up(
    spec: &AutoscalingSpec,
    sample: &Sample,
    (rec, why): (i32, &str),
    current: i32,
) -> Option<Decision> {
    let (n, _) = spec.objectives.as_ref().and(sample.objectives.as_ref())?;
    let to = (*n).min(rec);
    (to > current).then(|| Decision {
        replicas: to,
        state: AutoscalerState::default(),
        reason: format!("scale up (objectives, no up-window): {why}"),
    })
}

/// One autoscaler pass: `sample` is None when metrics are missing or stale.
pub fn decide(
    spec: &AutoscalingSpec,
    state: &AutoscalerState,
    current: i32,
    sample: Option<&Sample>,
    now: Timestamp,
) -> Decision {
    // Bounds changed under us: move into them at once.
    let bounded = current.clamp(spec.min_replicas, spec.max_replicas);
    if bounded != current {
        return Decision {
            replicas: bounded,
            state: AutoscalerState::default(),
            reason: format!(
                "{current} replicas is outside [{}, {}]",
                spec.min_replicas, spec.max_replicas
            ),
        };
    }
    let Some(sample) = sample else {
        // Never scale down blind; a pending scale-up may still wait for fresh metrics.
        return Decision {
            replicas: current,
            state: AutoscalerState {
                scale_up: state.scale_up.clone(),
                ..Default::default()
            },
            reason: "metrics unavailable; holding".into(),
        };
    };
    let (rec, why) = recommend(sample, spec, current);
    if let Some(up) = objectives_up(spec, sample, (rec, &why), current) {
        return up;
    }
    // A rise waits the up-window and goes to the lowest recommendation seen in it; a fall waits the
    // down-window and goes to the highest.
    let (old, keep, window, (moved, pending)) = match rec.cmp(&current) {
        Ordering::Greater => (
            state.scale_up.as_ref(),
            i32::min as fn(i32, i32) -> i32,
            spec.scale_up_stabilization_seconds,
            ("scale up", "scale-up pending"),
        ),
        Ordering::Less => (
            state.scale_down.as_ref(),
            i32::max as fn(i32, i32) -> i32,
            spec.scale_down_stabilization_seconds,
            ("scale down", "scale-down pending"),
        ),
        Ordering::Equal => {
            return Decision {
                replicas: current,
                state: AutoscalerState::default(),
                reason: format!("steady: {why}"),
            };
        }
    };
    let candidate = ScalingCandidate {
        since: old.map_or(Time(now), |c| c.since.clone()),
        replicas: old.map_or(rec, |c| keep(c.replicas, rec)),
    };
    if elapsed_secs(&candidate.since, now) >= i64::from(window) {
        return Decision {
            replicas: candidate.replicas,
            state: AutoscalerState::default(),
            reason: format!("{moved}: {why}"),
        };
    }
    let mut kept = AutoscalerState::default();
    if rec > current {
        kept.scale_up = Some(candidate);
    } else {
        kept.scale_down = Some(candidate);
    }
    Decision {
        replicas: current,
        state: kept,
        reason: format!("{pending}: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(min: i32, max: i32, up: i32, down: i32) -> AutoscalingSpec {
        serde_json::from_value(serde_json::json!({
            "minReplicas": min, "maxReplicas": max, "targetQueueDepthPerReplica": 4,
            "targetKvCacheUtilization": 0.8, "scaleUpStabilizationSeconds": up, "scaleDownStabilizationSeconds": down
        }))
        .unwrap()
    }

    fn sample(replicas: i32, waiting: f64, kv: f64) -> Sample {
        Sample {
            replicas,
            waiting,
            running: 0.0,
            kv_mean: kv,
            objectives: None,
        }
    }

    #[test]
    fn recommendation_table() {
        let s = spec(1, 10, 0, 0);
        // (current, sample, expected)
        let cases = [
            (1, sample(1, 0.0, 0.0), 1),    // idle: min
            (1, sample(1, 4.0, 0.1), 1),    // exactly on target
            (1, sample(1, 5.0, 0.1), 2),    // ceil(5/4) = 2
            (2, sample(2, 37.0, 0.1), 4),   // ceil(37/4) = 10, but at most doubling
            (5, sample(5, 37.0, 0.1), 10),  // 10, within max
            (8, sample(8, 100.0, 0.1), 10), // capped by max
            (2, sample(2, 0.0, 0.96), 3),   // KV: ceil(2 * 0.96 / 0.8) = 3
            (3, sample(3, 0.0, 0.2), 1),    // KV: ceil(3 * 0.2 / 0.8) = 1
        ];
        for (current, sample, expected) in cases {
            assert_eq!(
                recommend(&sample, &s, current).0,
                expected,
                "current {current} {sample:?}"
            );
        }
        assert_eq!(
            recommend(&sample(1, 0.0, 0.0), &spec(2, 5, 0, 0), 1).0,
            2,
            "min wins"
        );
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn scale_up_waits_for_the_window_and_takes_the_lowest_recommendation() {
        let s = spec(1, 10, 10, 60);
        let mut state = AutoscalerState::default();
        let d = decide(&s, &state, 2, Some(&sample(2, 16.0, 0.1)), at(0)); // rec 4
        assert_eq!(d.replicas, 2);
        assert_eq!(d.state.scale_up.as_ref().unwrap().replicas, 4);
        state = d.state;
        let d = decide(&s, &state, 2, Some(&sample(2, 12.0, 0.1)), at(5)); // rec 3: lowest so far
        assert_eq!((d.replicas, d.state.scale_up.as_ref().unwrap().replicas), (2, 3));
        assert_eq!(
            d.state.scale_up.as_ref().unwrap().since,
            Time(at(0)),
            "the window keeps its start"
        );
        state = d.state;
        let d = decide(&s, &state, 2, Some(&sample(2, 16.0, 0.1)), at(10));
        assert_eq!(d.replicas, 3);
        assert_eq!(d.state, AutoscalerState::default());
        assert!(d.reason.starts_with("scale up"), "{}", d.reason);
    }

    #[test]
    fn a_dip_resets_the_scale_up_window() {
        let s = spec(1, 10, 10, 60);
        let d = decide(
            &s,
            &AutoscalerState::default(),
            2,
            Some(&sample(2, 16.0, 0.1)),
            at(0),
        );
        let d = decide(&s, &d.state, 2, Some(&sample(2, 8.0, 0.1)), at(5)); // rec 2 == current
        assert_eq!(d.state, AutoscalerState::default());
        let d = decide(&s, &d.state, 2, Some(&sample(2, 16.0, 0.1)), at(10));
        assert_eq!(d.replicas, 2, "the window restarted at t=10");
    }

    #[test]
    fn scale_down_needs_consistently_lower_recommendations() {
        let s = spec(1, 10, 0, 60);
        let d = decide(
            &s,
            &AutoscalerState::default(),
            4,
            Some(&sample(4, 0.0, 0.0)),
            at(0),
        ); // rec 1
        assert_eq!(d.replicas, 4);
        let d = decide(&s, &d.state, 4, Some(&sample(4, 8.0, 0.0)), at(30)); // rec 2: highest so far
        assert_eq!(d.state.scale_down.as_ref().unwrap().replicas, 2);
        let d = decide(&s, &d.state, 4, Some(&sample(4, 0.0, 0.0)), at(59));
        assert_eq!(d.replicas, 4);
        let d = decide(&s, &d.state, 4, Some(&sample(4, 0.0, 0.0)), at(60));
        assert_eq!(
            d.replicas, 2,
            "goes to the highest recommendation seen in the window"
        );
    }

    #[test]
    fn the_objectives_scale_up_at_once_the_queue_waits_its_window() {
        let mut s = spec(1, 10, 15, 60);
        let queue_only = sample(2, 16.0, 0.1); // the queue asks for 4
        let d = decide(&s, &AutoscalerState::default(), 2, Some(&queue_only), at(0));
        assert_eq!(d.replicas, 2, "the queue's scale-up waits: {}", d.reason);
        s.objectives = Some(serde_json::from_value(serde_json::json!({"ttftP95": "1s"})).unwrap());
        let ahead = Sample {
            objectives: Some((3, "projected".into())),
            ..queue_only.clone()
        };
        let d = decide(&s, &AutoscalerState::default(), 2, Some(&ahead), at(0));
        assert_eq!(d.replicas, 3, "the objectives' count at once, not the queue's 4");
        assert!(d.reason.starts_with("scale up (objectives"), "{}", d.reason);
        assert_eq!(d.state, AutoscalerState::default());
        // Clamped like any recommendation: at most double, at most max.
        let far = Sample {
            objectives: Some((9, "projected".into())),
            ..queue_only.clone()
        };
        assert_eq!(
            decide(&s, &AutoscalerState::default(), 2, Some(&far), at(0)).replicas,
            4
        );
        // Not above the current count: the windows as before (a scale-down still waits its window).
        let down = Sample {
            objectives: Some((1, "idle".into())),
            ..sample(3, 0.0, 0.0)
        };
        assert_eq!(
            decide(&s, &AutoscalerState::default(), 3, Some(&down), at(0)).replicas,
            3
        );
    }

    #[test]
    fn missing_metrics_never_scale_down() {
        let s = spec(1, 10, 0, 0);
        let d = decide(
            &s,
            &AutoscalerState::default(),
            4,
            Some(&sample(4, 0.0, 0.0)),
            at(0),
        );
        assert_eq!(
            d.replicas, 1,
            "with a zero window an idle fleet scales down at once"
        );
        let d = decide(&s, &AutoscalerState::default(), 4, None, at(0));
        assert_eq!(d.replicas, 4);
        assert!(d.state.scale_down.is_none());
    }

    #[test]
    fn bounds_apply_immediately() {
        let s = spec(2, 3, 600, 600);
        assert_eq!(
            decide(&s, &AutoscalerState::default(), 1, None, at(0)).replicas,
            2
        );
        assert_eq!(
            decide(&s, &AutoscalerState::default(), 7, None, at(0)).replicas,
            3
        );
    }
}
