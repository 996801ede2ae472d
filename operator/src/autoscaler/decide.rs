//! Autoscaling arithmetic, pure and table-tested.
//!
//! Recommendation = the largest of ceil(total waiting / target per replica), ceil(replicas × mean KV /
//! target KV) and the objectives' capacity model ([`super::objectives`]) — each where it is in force —
//! clamped to [max(min, 1), max] and to at most double the current count (scaling to and from zero is
//! `controller/zero.rs`'s, on the gateway's demand). A recommendation above the current count
//! must hold for the scale-up window (the count then goes to the lowest recommendation seen in it,
//! kept as O(1) state in [`AutoscalerState`]). Scaling down follows HPA's rolling stabilization
//! window: on every pass the count goes to the highest recommendation of the last
//! `scaleDownStabilizationSeconds` when that is below it ([`DownWindow`], a sliding-window maximum
//! in the leader's memory) — so 3 → 1 by way of 2 takes one window, not one per step — and only once
//! a whole window of readings has been seen (a new leader, or a gap in the metrics, starts over).
//!
//! The objectives' own scale-up is the exception: taken at once, without the up-window. Their model
//! already looks ahead (the arrival trend over a pod's lead time) and has its own hysteresis (up at a
//! 10% margin, down only at 25%, through the scale-down window); waiting the up-window on a rising
//! load is what lets the objective be violated before the replica arrives.
//!
//! And so is their scale-down hold ([`down_hold`]): where every target in force is an objective, the
//! arrival rate is not rising and the fleet has not scaled up for a whole window, the model's smaller
//! count must hold for the lead time (the time a scale-up takes to serve, so a wrong step down is
//! undone within it), not for the whole window. The window still bounds flapping: a scale-down within
//! a window of a scale-up waits it out, so at most one rise and fall per window, as before.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use modelfleet_crds::model_deployment::{AutoscalerState, AutoscalingSpec, ScalingCandidate};
use std::cmp::Ordering;

/// Fleet-wide figures from one metrics pass over the ready replicas.
#[derive(Clone, Debug, Default, PartialEq)]
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
    /// With objectives, where the arrival rate is not rising: the lead time, seconds from a scale-up
    /// asked for to its pod serving ([`down_hold`]).
    pub lead: Option<f64>,
}

/// The recommendations of the last scale-down window, as a sliding-window maximum: entries (time in
/// seconds, recommendation) oldest first, each recommendation higher than every later one, so the
/// first entry inside the window is the window's highest. At most one entry per distinct count. Kept
/// in the leader's memory, not in status: a new leader starts a window of its own.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DownWindow {
    /// The first reading of this unbroken run of readings.
    since: Option<i64>,
    peaks: Vec<(i64, i32)>,
    /// The last scale-up this leader decided.
    rose: Option<i64>,
}

impl DownWindow {
    /// Notes `rec`, recommended at `now`, for a window of `window` seconds.
    pub fn observe(&mut self, now: i64, rec: i32, window: i64) {
        self.since.get_or_insert(now);
        while self.peaks.last().is_some_and(|&(_, r)| r <= rec) {
            self.peaks.pop();
        }
        self.peaks.push((now, rec));
        // Entries before the window bound nothing any more (the newest is always inside it).
        let inside = self.peaks.iter().position(|&(t, _)| t >= now - window);
        self.peaks.drain(..inside.unwrap_or(self.peaks.len() - 1));
    }

    /// The highest recommendation of the last `window` seconds (at most the window `observe` is
    /// given), once readings have covered that long.
    pub fn highest(&self, now: i64, window: i64) -> Option<i32> {
        let covered = now - self.since? >= window;
        covered.then(|| self.peak(now, window)).flatten()
    }

    /// The highest recommendation of the last `window` seconds seen so far. Every entry dropped from
    /// `peaks` was at most a later one, so the first entry inside the window is its maximum.
    fn peak(&self, now: i64, window: i64) -> Option<i32> {
        let first = self.peaks.iter().find(|&&(t, _)| t >= now - window);
        first.map(|p| p.1)
    }

    /// Readings have covered a whole `window` and it holds no scale-up.
    fn calm(&self, now: i64, window: i64) -> bool {
        let covered = self.since.is_some_and(|s| now - s >= window);
        covered && self.rose.is_none_or(|t| now - t >= window)
    }

    /// A gap in the readings: the next window starts from scratch.
    pub fn clear(&mut self) {
        *self = DownWindow::default();
    }
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

/// The scale-down hold in force, seconds: the spec's `window`, or the lead time (at most the window)
/// where every target in force is an objective, the model sized this pass on an arrival rate that is
/// not rising (`sample.lead`) and the last whole window held no scale-up ([`DownWindow::calm`]). The
/// model's own hysteresis (down only at a 25% margin, up at 10%) is what keeps noise from stepping
/// down; the lead time is how long a wrong step takes to undo.
pub fn down_hold(spec: &AutoscalingSpec, sample: &Sample, down: &DownWindow, now: i64, window: i64) -> i64 {
    let objectives_only =
        spec.objectives.is_some() && spec.queue_target().is_none() && spec.kv_target().is_none();
    match sample.lead {
        Some(lead) if objectives_only && sample.objectives.is_some() && down.calm(now, window) => {
            (lead.ceil() as i64).clamp(1, window.max(1))
        }
        _ => window,
    }
}

/// One autoscaler pass: `sample` is None when metrics are missing or stale; `down` is the deployment's
/// scale-down window, updated (with the time of a scale-up this pass decides).
pub fn decide(
    spec: &AutoscalingSpec,
    state: &AutoscalerState,
    down: &mut DownWindow,
    current: i32,
    sample: Option<&Sample>,
    now: Timestamp,
) -> Decision {
    let d = decide_pass(spec, state, down, current, sample, now);
    if d.replicas > current {
        down.rose = Some(now.as_second());
    }
    d
}

fn decide_pass(
    spec: &AutoscalingSpec,
    state: &AutoscalerState,
    down: &mut DownWindow,
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
        down.clear();
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
    let window = i64::from(spec.scale_down_stabilization_seconds);
    down.observe(now.as_second(), rec, window);
    let down_window = down_hold(spec, sample, down, now.as_second(), window);
    if let Some(up) = objectives_up(spec, sample, (rec, &why), current) {
        return up;
    }
    match rec.cmp(&current) {
        Ordering::Greater => scale_up(spec, state, rec, current, why, now),
        Ordering::Less => match down.highest(now.as_second(), down_window) {
            Some(highest) if highest < current => Decision {
                replicas: highest,
                state: AutoscalerState::default(),
                reason: format!(
                    "scale down to the highest recommendation of the last {down_window} s: {why}"
                ),
            },
            // Shown in status while the window still holds a higher recommendation, or is not full.
            _ => Decision {
                replicas: current,
                state: AutoscalerState {
                    scale_down: Some(ScalingCandidate {
                        since: state.scale_down.as_ref().map_or(Time(now), |c| c.since.clone()),
                        replicas: down.peak(now.as_second(), down_window).unwrap_or(rec),
                    }),
                    ..Default::default()
                },
                reason: format!("scale-down pending: {why}"),
            },
        },
        Ordering::Equal => Decision {
            replicas: current,
            state: AutoscalerState::default(),
            reason: format!("steady: {why}"),
        },
    }
}

/// A rise waits the up-window and goes to the lowest recommendation seen in it.
fn scale_up(
    spec: &AutoscalingSpec,
    state: &AutoscalerState,
    rec: i32,
    current: i32,
    why: String,
    now: Timestamp,
) -> Decision {
    let old = state.scale_up.as_ref();
    let candidate = ScalingCandidate {
        since: old.map_or(Time(now), |c| c.since.clone()),
        replicas: old.map_or(rec, |c| c.replicas.min(rec)),
    };
    if elapsed_secs(&candidate.since, now) >= i64::from(spec.scale_up_stabilization_seconds) {
        return Decision {
            replicas: candidate.replicas,
            state: AutoscalerState::default(),
            reason: format!("scale up: {why}"),
        };
    }
    Decision {
        replicas: current,
        state: AutoscalerState {
            scale_up: Some(candidate),
            ..Default::default()
        },
        reason: format!("scale-up pending: {why}"),
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
            lead: None,
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
        let mut w = DownWindow::default();
        let mut state = AutoscalerState::default();
        let d = decide(&s, &state, &mut w, 2, Some(&sample(2, 16.0, 0.1)), at(0)); // rec 4
        assert_eq!(d.replicas, 2);
        assert_eq!(d.state.scale_up.as_ref().unwrap().replicas, 4);
        state = d.state;
        let d = decide(&s, &state, &mut w, 2, Some(&sample(2, 12.0, 0.1)), at(5)); // rec 3: lowest so far
        assert_eq!((d.replicas, d.state.scale_up.as_ref().unwrap().replicas), (2, 3));
        assert_eq!(
            d.state.scale_up.as_ref().unwrap().since,
            Time(at(0)),
            "the window keeps its start"
        );
        state = d.state;
        let d = decide(&s, &state, &mut w, 2, Some(&sample(2, 16.0, 0.1)), at(10));
        assert_eq!(d.replicas, 3);
        assert_eq!(d.state, AutoscalerState::default());
        assert!(d.reason.starts_with("scale up"), "{}", d.reason);
    }

    #[test]
    fn a_dip_resets_the_scale_up_window() {
        let s = spec(1, 10, 10, 60);
        let mut w = DownWindow::default();
        let d = decide(
            &s,
            &AutoscalerState::default(),
            &mut w,
            2,
            Some(&sample(2, 16.0, 0.1)),
            at(0),
        );
        let d = decide(&s, &d.state, &mut w, 2, Some(&sample(2, 8.0, 0.1)), at(5)); // rec 2 == current
        assert_eq!(d.state, AutoscalerState::default());
        let d = decide(&s, &d.state, &mut w, 2, Some(&sample(2, 16.0, 0.1)), at(10));
        assert_eq!(d.replicas, 2, "the window restarted at t=10");
    }

    #[test]
    fn scale_down_needs_consistently_lower_recommendations() {
        let s = spec(1, 10, 0, 60);
        let mut w = DownWindow::default();
        let d = decide(
            &s,
            &AutoscalerState::default(),
            &mut w,
            4,
            Some(&sample(4, 0.0, 0.0)),
            at(0),
        ); // rec 1
        assert_eq!(d.replicas, 4);
        let d = decide(&s, &d.state, &mut w, 4, Some(&sample(4, 8.0, 0.0)), at(30)); // rec 2: highest so far
        assert_eq!(d.state.scale_down.as_ref().unwrap().replicas, 2);
        let d = decide(&s, &d.state, &mut w, 4, Some(&sample(4, 0.0, 0.0)), at(59));
        assert_eq!(d.replicas, 4);
        let d = decide(&s, &d.state, &mut w, 4, Some(&sample(4, 0.0, 0.0)), at(60));
        assert_eq!(
            d.replicas, 2,
            "goes to the highest recommendation seen in the window"
        );
    }

    #[test]
    fn the_down_window_rolls_three_to_one_by_way_of_two_takes_one_window() {
        // Queue target 4: 8 waiting recommend 2, none recommend 1. The load falls to 2's worth at
        // t=0 and to 1's at t=10; the window is 30 s.
        let s = spec(1, 10, 0, 30);
        let mut w = DownWindow::default();
        let mut state = AutoscalerState::default();
        let mut current = 3;
        let mut moves = Vec::new();
        for t in (-30..=60).step_by(3) {
            let waiting = match t {
                ..0 => 12.0,
                0..10 => 8.0,
                _ => 0.0,
            };
            let d = decide(
                &s,
                &state,
                &mut w,
                current,
                Some(&sample(current, waiting, 0.0)),
                at(t),
            );
            if d.replicas != current {
                moves.push((t, d.replicas));
            }
            (state, current) = (d.state, d.replicas);
        }
        // 2 once the window holds nothing above 2 (the last 3 was at t=-3); 1 once the last 2 (t=9)
        // left it — 12 s after the first step, not a whole window.
        assert_eq!(moves, vec![(30, 2), (42, 1)]);
    }

    #[test]
    fn the_down_window_needs_a_whole_window_of_readings() {
        let s = spec(1, 10, 0, 30);
        let mut w = DownWindow::default();
        let idle = sample(3, 0.0, 0.0);
        let d = decide(&s, &AutoscalerState::default(), &mut w, 3, Some(&idle), at(0));
        assert_eq!(d.replicas, 3);
        assert_eq!(d.state.scale_down.as_ref().unwrap().replicas, 1, "pending, shown");
        let d = decide(&s, &d.state, &mut w, 3, None, at(15)); // a gap: start over
        assert_eq!(d.replicas, 3);
        let d = decide(&s, &d.state, &mut w, 3, Some(&idle), at(18));
        assert_eq!(d.replicas, 3);
        let d = decide(&s, &d.state, &mut w, 3, Some(&idle), at(47));
        assert_eq!(d.replicas, 3, "29 s of readings since the gap");
        let d = decide(&s, &d.state, &mut w, 3, Some(&idle), at(48));
        assert_eq!(d.replicas, 1);
    }

    #[test]
    fn the_down_window_is_a_sliding_maximum() {
        let mut w = DownWindow::default();
        for (t, rec) in [(0, 4), (5, 2), (10, 3), (15, 1), (20, 1)] {
            w.observe(t, rec, 10);
        }
        // Inside [10, 20]: 3 at 10, then 1s.
        assert_eq!(w.highest(20, 10), Some(3));
        assert_eq!(
            w.peaks,
            vec![(10, 3), (20, 1)],
            "one entry per count, newest last"
        );
        w.observe(21, 1, 10);
        assert_eq!(w.highest(21, 10), Some(1), "the 3 left the window");
        assert_eq!(w.highest(21, 30), None, "21 s of readings do not cover 30");
    }

    #[test]
    fn the_objectives_scale_up_at_once_the_queue_waits_its_window() {
        let mut s = spec(1, 10, 15, 60);
        let mut w = DownWindow::default();
        let queue_only = sample(2, 16.0, 0.1); // the queue asks for 4
        let d = decide(
            &s,
            &AutoscalerState::default(),
            &mut w,
            2,
            Some(&queue_only),
            at(0),
        );
        assert_eq!(d.replicas, 2, "the queue's scale-up waits: {}", d.reason);
        s.objectives = Some(serde_json::from_value(serde_json::json!({"ttftP95": "1s"})).unwrap());
        let ahead = Sample {
            objectives: Some((3, "projected".into())),
            ..queue_only.clone()
        };
        let d = decide(&s, &AutoscalerState::default(), &mut w, 2, Some(&ahead), at(0));
        assert_eq!(d.replicas, 3, "the objectives' count at once, not the queue's 4");
        assert!(d.reason.starts_with("scale up (objectives"), "{}", d.reason);
        assert_eq!(d.state, AutoscalerState::default());
        // Clamped like any recommendation: at most double, at most max.
        let far = Sample {
            objectives: Some((9, "projected".into())),
            ..queue_only.clone()
        };
        assert_eq!(
            decide(&s, &AutoscalerState::default(), &mut w, 2, Some(&far), at(0)).replicas,
            4
        );
        // Not above the current count: the windows as before (a scale-down still waits its window).
        let down = Sample {
            objectives: Some((1, "idle".into())),
            ..sample(3, 0.0, 0.0)
        };
        assert_eq!(
            decide(&s, &AutoscalerState::default(), &mut w, 3, Some(&down), at(0)).replicas,
            3
        );
    }

    /// Objectives only (`ttftP95`), up-window 15 s, down-window 30 s.
    fn objectives_only() -> AutoscalingSpec {
        serde_json::from_value(serde_json::json!({
            "minReplicas": 1, "maxReplicas": 10, "scaleUpStabilizationSeconds": 15,
            "scaleDownStabilizationSeconds": 30, "objectives": {"ttftP95": "1s"}
        }))
        .unwrap()
    }

    /// A pass where the objectives' model asks for `n`, with a 10 s lead time.
    fn sized(replicas: i32, n: i32) -> Sample {
        Sample {
            objectives: Some((n, "model".into())),
            lead: Some(10.0),
            ..sample(replicas, 0.0, 0.0)
        }
    }

    /// Feeds `(second, model's count)` passes at `current` replicas; the count after each.
    fn run(spec: &AutoscalingSpec, w: &mut DownWindow, current: i32, passes: &[(i64, i32)]) -> Vec<i32> {
        let state = AutoscalerState::default();
        let at_n = |&(t, n): &(i64, i32)| (t, sized(current, n));
        let passes: Vec<_> = passes.iter().map(at_n).collect();
        passes
            .iter()
            .map(|(t, s)| decide(spec, &state, w, current, Some(s), at(*t)).replicas)
            .collect()
    }

    #[test]
    fn objectives_only_step_down_after_the_lead_time_when_calm() {
        let s = objectives_only();
        let mut w = DownWindow::default();
        let steady: Vec<(i64, i32)> = (0..=8).map(|i| (i * 5, 3)).collect(); // 0..40 s at 3
        assert!(run(&s, &mut w, 3, &steady).iter().all(|&r| r == 3));
        // The model says 2 from 45 s: held for the 10 s lead time, not the 30 s window.
        assert_eq!(run(&s, &mut w, 3, &[(45, 2), (50, 2), (55, 2)]), [3, 3, 2]);
        // With a queue target in force too, the window holds as before.
        let mut with_queue = objectives_only();
        with_queue.target_queue_depth_per_replica = Some(4);
        let mut w = DownWindow::default();
        run(&with_queue, &mut w, 3, &steady);
        assert_eq!(
            run(&with_queue, &mut w, 3, &[(45, 2), (55, 2), (70, 2), (75, 2)]),
            [3, 3, 3, 2]
        );
        // Without a lead time (the model did not size this pass), likewise.
        let mut w = DownWindow::default();
        let mut no_lead = |t: i64, n: i32| {
            let sample = Sample {
                lead: None,
                ..sized(3, n)
            };
            decide(&s, &AutoscalerState::default(), &mut w, 3, Some(&sample), at(t)).replicas
        };
        (0..=8).for_each(|i| assert_eq!(no_lead(i * 5, 3), 3));
        assert_eq!([no_lead(45, 2), no_lead(55, 2), no_lead(75, 2)], [3, 3, 2]);
    }

    #[test]
    fn a_scale_up_keeps_the_whole_window_before_the_next_step_down() {
        let s = objectives_only();
        let mut w = DownWindow::default();
        let steady: Vec<(i64, i32)> = (0..=8).map(|i| (i * 5, 2)).collect();
        run(&s, &mut w, 2, &steady);
        assert_eq!(run(&s, &mut w, 2, &[(45, 3)]), [3], "up at once");
        // At 3, the model wants 2 again from 50 s: no step down until a whole window after the rise
        // (75 s), though the lower count has held for the lead time since 60 s.
        let after: Vec<(i64, i32)> = (10..=15).map(|i| (i * 5, 2)).collect();
        assert_eq!(run(&s, &mut w, 3, &after), [3, 3, 3, 3, 3, 2]);
    }

    #[test]
    fn missing_metrics_never_scale_down() {
        let s = spec(1, 10, 0, 0);
        let mut w = DownWindow::default();
        let d = decide(
            &s,
            &AutoscalerState::default(),
            &mut w,
            4,
            Some(&sample(4, 0.0, 0.0)),
            at(0),
        );
        assert_eq!(
            d.replicas, 1,
            "with a zero window an idle fleet scales down at once"
        );
        let d = decide(&s, &AutoscalerState::default(), &mut w, 4, None, at(0));
        assert_eq!(d.replicas, 4);
        assert!(d.state.scale_down.is_none());
    }

    #[test]
    fn bounds_apply_immediately() {
        let s = spec(2, 3, 600, 600);
        let mut w = DownWindow::default();
        assert_eq!(
            decide(&s, &AutoscalerState::default(), &mut w, 1, None, at(0)).replicas,
            2
        );
        assert_eq!(
            decide(&s, &AutoscalerState::default(), &mut w, 7, None, at(0)).replicas,
            3
        );
    }
}
