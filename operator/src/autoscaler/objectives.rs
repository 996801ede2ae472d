//! The capacity model behind `spec.autoscaling.objectives`: the replicas that hold a p95 time to
//! first token and a p95 inter-token latency for the observed load. Pure; `docs/autoscaling.md` has the
//! derivation, its assumptions and when it is wrong.
//!
//! One replica under continuous batching: a step over `b` sequences takes `t(b) ≈ t₀ + b/μ`, `μ` the
//! replica's output tokens/s at saturation (measured: intervals whose queue never emptied). Serving `λ`
//! output tokens/s means `b / t(b) = λ`, so `t = t₀ / (1 − ρ)` with `ρ = λ/μ`: each token — and each
//! prefill chunk, which rides in the same steps — takes `1/(1 − ρ)` times its unloaded time. Over `n`
//! replicas `ρ(n) = Λ / (n·μ)`, `Λ` the output tokens/s arriving requests ask for (arrivals × mean
//! output length: above production under overload; below it while a backlog drains, which the
//! backlog term counts instead), production until a request finished.
//!
//! Calibration: a measured p95 `L` at the current `ρ` estimates the unloaded p95 as `L·(1 − ρ)` (none
//! where `ρ ≥ 0.9`); `L₀` is the lowest estimate of the last minutes (the caller keeps them): a backlog
//! left by a burst inflates `L` beyond what the current `ρ` explains, never below. An objective `T` is met at `n`
//! replicas when `L₀ / (1 − ρ(n)) ≤ (1 − m)·T`, so `n ≥ Λ / (μ · (1 − L₀ / ((1 − m)·T)))`.
//!
//! Decisions: the count needed with margin [`UP_MARGIN`] above the current count is a scale-up (taken
//! at once: `decide` skips the up-window for it) — and requests waiting with a p95 of the last seconds
//! over `(1 − m)·T` ask for at least one replica more than those measured (the model is wrong when the
//! measurement says so: a calibration that lags, a mix it has not seen); below it, the fleet goes down
//! only to the count that still meets every objective with [`DOWN_MARGIN`] (hysteresis, before the
//! scale-down window). Rising load: `Λ` is projected over the horizon (how long a new pod takes to
//! become Ready: when a scale-up asked for now serves) along the arrival rate's trend, upward only. A
//! backlog (requests waiting for a batch slot) is demand for the time to first token: its tokens are
//! to be served within the horizon, so they add `waiting × output length / horizon` to the TTFT
//! objective's `Λ`. Not to the ITL objective's: a token's latency is the step time of the batch that
//! runs, whose size `maxNumSeqs` bounds however many wait, and a one-off backlog must not buy a
//! replica that the steady load does not need.
//!
//! Invariants: without a measured `μ` the model cannot size down — it scales up in proportion to the
//! worst objective's overshoot and otherwise holds; an objective no count can meet (`L₀ ≥ (1 − m)·T`:
//! the unloaded latency is already too slow) holds the count and says so; an idle fleet (nothing
//! arriving, nothing produced) needs 1, whether `μ` is known or not.

/// The scale-up margin: aim 10% under each objective.
pub const UP_MARGIN: f64 = 0.10;
/// The scale-down margin: a smaller fleet must stay 25% under each objective.
pub const DOWN_MARGIN: f64 = 0.25;
/// Above this utilisation the unloaded latency is taken from memory, not from the measurement.
pub const CALIBRATION_LIMIT: f64 = 0.9;
/// Utilisation aimed for when no unloaded latency is known yet.
pub const FALLBACK_UTILIZATION: f64 = 0.7;

/// What the replicas measured over the objectives window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Load {
    /// Replicas read.
    pub replicas: i32,
    /// Output tokens/s the fleet produced.
    pub token_rate: f64,
    /// Requests arriving per second.
    pub arrival_rate: f64,
    /// Mean output tokens per finished request (0 when none finished).
    pub output_tokens: f64,
    /// Change of the arrival rate, requests/s per second.
    pub arrival_trend: f64,
    /// Requests waiting for a batch slot now, fleet-wide.
    pub waiting: f64,
    /// Measured p95 time to first token over the window, seconds.
    pub ttft_p95: Option<f64>,
    /// Measured p95 inter-token latency over the window, seconds.
    pub itl_p95: Option<f64>,
    /// The p95s (TTFT, ITL) of the last few seconds (the rates' span): what the fleet does now.
    pub recent_p95: [Option<f64>; 2],
}

/// The objectives, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Targets {
    /// p95 TTFT.
    pub ttft: Option<f64>,
    /// p95 ITL.
    pub itl: Option<f64>,
}

/// Unloaded p95s (TTFT, ITL), seconds: into [`needed`] the lowest recent estimates, out of it this
/// window's.
pub type Unloaded = [Option<f64>; 2];

/// The model's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Need {
    /// The recommended count (before bounds and windows).
    pub replicas: i32,
    /// This window's estimates of the unloaded p95s (none where the utilisation was too high).
    pub unloaded: Unloaded,
    /// Why, in words.
    pub why: String,
    /// The arrival rate is rising (its trend is above zero): a step down then waits the whole
    /// scale-down window ([`super::decide::down_hold`]).
    pub rising: bool,
}

/// The replicas `targets` need under `load` with the fleet at `current`, given the saturated output
/// tokens/s of one replica (`mu`), the horizon in seconds (from a decision to a new pod serving) and
/// the remembered unloaded latencies.
pub fn needed(
    load: &Load,
    targets: &Targets,
    mu: Option<f64>,
    horizon: f64,
    current: i32,
    remembered: Unloaded,
) -> Need {
    // What arrives is the load to size for: production above it is a backlog draining (the `waiting`
    // term below), production under it an overload. Before a request finished the length is unknown,
    // and production is all there is.
    let now_rate = if load.output_tokens > 0.0 {
        load.arrival_rate * load.output_tokens
    } else {
        load.token_rate
    };
    let growth = if load.arrival_rate > 0.0 {
        (load.arrival_rate + load.arrival_trend.max(0.0) * horizon) / load.arrival_rate
    } else {
        1.0
    };
    let backlog = load.waiting * load.output_tokens / horizon.max(1.0);
    let steady = now_rate * growth;
    let projected = steady + backlog;
    let mut unloaded = remembered;
    let mut replicas = 1;
    let mut why = vec![format!(
        "{:.3} req/s x {:.0} tokens, {:.1} tokens/s now, {:.0} waiting -> {:.1} in {horizon:.0} s",
        load.arrival_rate, load.output_tokens, now_rate, load.waiting, projected
    )];
    if load.token_rate == 0.0 && load.arrival_rate == 0.0 && load.waiting == 0.0 {
        why.push("idle: nothing arrived or was produced in the window".into());
        return Need {
            replicas: 1,
            unloaded,
            why: why.join("; "),
            rising: false,
        };
    }
    let objectives = [
        ("TTFT", targets.ttft, load.ttft_p95),
        ("ITL", targets.itl, load.itl_p95),
    ];
    for (i, (name, target, measured)) in objectives.into_iter().enumerate() {
        let Some(target) = target else { continue };
        let (n, because) = match mu.filter(|m| *m > 0.0) {
            Some(mu) => sized(
                load,
                i,
                (now_rate, if i == 0 { projected } else { steady }),
                mu,
                target,
                current,
                &mut unloaded[i],
            ),
            None => proportional(current, target, measured),
        };
        replicas = replicas.max(n);
        why.push(format!("{name} {because}"));
    }
    Need {
        replicas: replicas.max(1),
        unloaded,
        why: why.join("; "),
        rising: load.arrival_trend > 0.0,
    }
}

/// The count for objective `i` (0 TTFT, 1 ITL) with a measured `mu`: `rates` are the fleet's output
/// tokens/s now and at the horizon.
fn sized(
    load: &Load,
    i: usize,
    (now_rate, projected): (f64, f64),
    mu: f64,
    target: f64,
    current: i32,
    unloaded: &mut Option<f64>,
) -> (i32, String) {
    let read = load.replicas;
    let measured = [load.ttft_p95, load.itl_p95][i];
    let recent = load.recent_p95[i].or(measured);
    // The utilisation the measured p95 was taken at: what the replicas produced, or what arrived when
    // that was more (an overload, whose p95 says nothing of the unloaded latency).
    let rho_now = load.token_rate.max(now_rate) / (f64::from(read.max(1)) * mu);
    // This window's estimate, when the utilisation leaves it meaningful; `unloaded` comes in as the
    // lowest recent estimate and goes out as this one.
    let fresh = measured
        .filter(|_| rho_now < CALIBRATION_LIMIT)
        .map(|l| l * (1.0 - rho_now));
    let lowest = match (*unloaded, fresh) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    *unloaded = fresh;
    let p95 = measured.map_or("no p95 yet".to_string(), |l| format!("p95 {}", secs(l)));
    let Some(l0) = lowest else {
        let n = (projected / (mu * FALLBACK_UTILIZATION)).ceil() as i32;
        return (
            n,
            format!(
                "{p95} / {}, unloaded p95 unknown: utilisation {FALLBACK_UTILIZATION} -> {n}",
                secs(target)
            ),
        );
    };
    let count = |margin: f64| -> Option<i32> {
        let headroom = 1.0 - l0 / ((1.0 - margin) * target);
        (headroom > 0.0).then(|| (projected / (mu * headroom)).ceil() as i32)
    };
    let Some(up) = count(UP_MARGIN) else {
        return (
            current,
            format!(
                "{p95} / {}: unloaded p95 {} leaves no room, more replicas cannot meet it; holding",
                secs(target),
                secs(l0)
            ),
        );
    };
    // The model is wrong when the measurement says so (a calibration that lags, a mix it has not
    // seen): requests queueing and a p95 of the last seconds over the objective ask for one replica
    // more than those measured. One, not in proportion to the overshoot: the window's p95 stays high
    // for a window after a backlog drained (the backlog itself is demand above), and a replica still
    // starting is not asked for twice.
    let floor = recent
        .filter(|l| *l > (1.0 - UP_MARGIN) * target && load.waiting > 0.0)
        .map_or(0, |_| read.max(1) + 1);
    let n = if up.max(floor) > current {
        up.max(floor)
    } else {
        count(DOWN_MARGIN).map_or(current, |down| down.max(up).max(floor).min(current))
    };
    (
        n,
        format!(
            "{p95} / {}, unloaded {}, utilisation {:.2} of {:.1} tokens/s per replica -> {n}",
            secs(target),
            secs(l0),
            rho_now,
            mu
        ),
    )
}

/// Without a measured `mu`: up in proportion to the overshoot, never down.
fn proportional(current: i32, target: f64, measured: Option<f64>) -> (i32, String) {
    match measured {
        Some(l) if l > (1.0 - UP_MARGIN) * target => {
            let n = (f64::from(current.max(1)) * l / ((1.0 - UP_MARGIN) * target)).ceil() as i32;
            (
                n,
                format!(
                    "p95 {} / {}, no saturated throughput measured yet: x{:.2} -> {n}",
                    secs(l),
                    secs(target),
                    l / target
                ),
            )
        }
        Some(l) => (
            current,
            format!(
                "p95 {} / {}, no saturated throughput measured yet: holding",
                secs(l),
                secs(target)
            ),
        ),
        None => (current, format!("no p95 yet / {}: holding", secs(target))),
    }
}

/// A duration for people: `420ms`, `1.25s`.
pub fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0}ms", s * 1e3)
    } else {
        format!("{:.2}s", s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica serving `rate` tokens/s with p95s measured, μ = 400 tokens/s.
    fn load(replicas: i32, rate: f64, ttft: f64, itl: f64) -> Load {
        Load {
            replicas,
            token_rate: rate,
            arrival_rate: rate / 100.0,
            output_tokens: 100.0,
            arrival_trend: 0.0,
            waiting: 0.0,
            ttft_p95: Some(ttft),
            itl_p95: Some(itl),
            recent_p95: [None, None],
        }
    }

    const BOTH: Targets = Targets {
        ttft: Some(1.0),
        itl: Some(0.08),
    };

    #[test]
    fn sizes_from_the_calibrated_unloaded_latency() {
        // 2 replicas at ρ = 0.5 (400 of 800 tokens/s): ITL 60 ms -> L₀ 30 ms; TTFT 400 ms -> L₀ 200 ms.
        let n = needed(
            &load(2, 400.0, 0.4, 0.06),
            &BOTH,
            Some(400.0),
            60.0,
            2,
            [None, None],
        );
        assert_eq!(n.unloaded, [Some(0.2), Some(0.03)]);
        // ITL: headroom 1 − 0.03/0.072 = 0.583 -> 400/(400·0.583) = 1.71 -> 2 needed; down (25%):
        // 1 − 0.03/0.06 = 0.5 -> 2. TTFT: 1 − 0.2/0.9 -> 1.29 -> 2. Stays at 2.
        assert_eq!(n.replicas, 2, "{}", n.why);
        // Triple the load at 2 replicas: ρ = 1.5 from the demand side, L₀ remembered.
        let mut heavy = load(2, 800.0, 3.0, 0.5);
        heavy.arrival_rate = 12.0;
        let n2 = needed(&heavy, &BOTH, Some(400.0), 60.0, 2, n.unloaded);
        // The model: ITL 1200/(400·0.583) = 5.14 -> 6, TTFT 1200/(400·0.778) = 3.86 -> 4.
        assert_eq!(n2.replicas, 6, "{}", n2.why);
        assert_eq!(n2.unloaded, [None, None], "no estimate above ρ 0.9");
        // A backlog inflates TTFT to 3 s at ρ 0.5: this window estimates 1.5 s, but the lowest
        // recent estimate (200 ms) is the model's (2 replicas); with requests waiting, the p95 over the
        // objective asks for one more than the 2 measured: 3.
        let backlog = needed(
            &Load {
                waiting: 1.0,
                ..load(2, 400.0, 3.0, 0.06)
            },
            &BOTH,
            Some(400.0),
            60.0,
            2,
            n.unloaded,
        );
        assert_eq!(backlog.unloaded[0], Some(1.5));
        assert!(backlog.why.contains("unloaded 200ms"), "{}", backlog.why);
        assert_eq!(backlog.replicas, 3, "{}", backlog.why);
    }

    #[test]
    fn a_backlog_is_demand_and_the_last_seconds_judge_the_model() {
        let remembered = [Some(0.2), Some(0.03)];
        // 200 requests of 100 tokens waiting, to be served within the 60 s horizon: +333.3 tokens/s,
        // 733.3 in all, for the TTFT: 733.3/(400·0.778) = 2.36 -> 3. The ITL is sized for what
        // arrives: 400/(400·0.583) = 1.71 -> 2.
        let mut l = load(2, 400.0, 0.4, 0.06);
        l.waiting = 200.0;
        let n = needed(&l, &BOTH, Some(400.0), 60.0, 2, remembered);
        assert_eq!(n.replicas, 3, "{}", n.why);
        assert!(n.why.contains("200 waiting -> 733.3 in 60 s"), "{}", n.why);
        let itl_only = Targets {
            ttft: None,
            itl: Some(0.08),
        };
        let n = needed(&l, &itl_only, Some(400.0), 60.0, 2, remembered);
        assert_eq!(n.replicas, 2, "a backlog is not ITL demand: {}", n.why);
        // Production above the arrivals is a backlog draining: sized for what arrives (400 tokens/s
        // -> 2), not for the 800 produced (-> 4).
        let draining = Load {
            token_rate: 800.0,
            ..load(2, 400.0, 0.4, 0.06)
        };
        assert_eq!(
            needed(&draining, &BOTH, Some(400.0), 60.0, 2, remembered).replicas,
            2
        );
        // The window's p95 is still over the objective (a backlog that drained within it), the last
        // seconds' is not: the model's count, no more.
        let mut drained = load(2, 400.0, 3.0, 0.06);
        drained.recent_p95 = [Some(0.3), Some(0.05)];
        assert_eq!(
            needed(&drained, &BOTH, Some(400.0), 60.0, 2, remembered).replicas,
            2
        );
        // Over the objective in the last seconds without a queue: slow, but not for want of replicas.
        drained.recent_p95 = [Some(1.2), Some(0.05)];
        assert_eq!(
            needed(&drained, &BOTH, Some(400.0), 60.0, 2, remembered).replicas,
            2
        );
        // With requests waiting: one more than the replicas measured (4 asked for already, 2 read:
        // the model would go down to 2 or 3, the queue keeps 3).
        drained.waiting = 1.0;
        assert_eq!(
            needed(&drained, &BOTH, Some(400.0), 60.0, 4, remembered).replicas,
            3
        );
        assert_eq!(
            needed(&drained, &BOTH, Some(400.0), 60.0, 2, remembered).replicas,
            3
        );
    }

    #[test]
    fn scale_down_only_with_the_wider_margin() {
        // 4 replicas at ρ = 0.25 (400 of 1600 tokens/s), ITL 40 ms -> L₀ 30 ms.
        let n = needed(
            &load(4, 400.0, 0.3, 0.04),
            &Targets {
                ttft: None,
                itl: Some(0.08),
            },
            Some(400.0),
            60.0,
            4,
            [None, None],
        );
        // up: 400/(400·0.583) -> 2; down: 400/(400·0.5) -> 2.
        assert_eq!(n.replicas, 2, "{}", n.why);
        // Closer to the objective the down margin keeps more than the up margin would.
        let tight = needed(
            &load(4, 400.0, 0.3, 0.048),
            &Targets {
                ttft: None,
                itl: Some(0.08),
            },
            Some(400.0),
            60.0,
            4,
            [None, None],
        );
        // L₀ = 36 ms: up: 1 − 0.036/0.072 = 0.5 -> 2; down: 1 − 0.036/0.06 = 0.4 -> 2.5 -> 3.
        assert_eq!(tight.replicas, 3, "{}", tight.why);
    }

    #[test]
    fn rising_arrivals_buy_replicas_ahead() {
        let mut l = load(2, 400.0, 0.4, 0.06);
        let flat = needed(&l, &BOTH, Some(400.0), 60.0, 2, [None, None]);
        assert!(!flat.rising);
        let flat = flat.replicas;
        l.arrival_trend = 4.0 / 60.0; // 4 -> 8 req/s within the lead time
        let rising = needed(&l, &BOTH, Some(400.0), 60.0, 2, [None, None]);
        assert!(
            rising.rising,
            "a rising load is marked: it holds a step down for the whole window"
        );
        let rising = rising.replicas;
        assert!(rising > flat, "{rising} vs {flat}");
        l.arrival_trend = -1.0;
        assert_eq!(
            needed(&l, &BOTH, Some(400.0), 60.0, 2, [None, None]).replicas,
            flat,
            "falling: no lead"
        );
    }

    #[test]
    fn an_objective_below_the_unloaded_latency_holds() {
        let n = needed(
            &load(2, 100.0, 2.0, 0.03),
            &Targets {
                ttft: Some(1.0),
                itl: None,
            },
            Some(400.0),
            60.0,
            3,
            [None, None],
        );
        assert_eq!(n.replicas, 3);
        assert!(n.why.contains("cannot meet"), "{}", n.why);
    }

    #[test]
    fn without_saturated_throughput_up_in_proportion_never_down() {
        let over = needed(&load(2, 300.0, 2.7, 0.03), &BOTH, None, 60.0, 2, [None, None]);
        assert_eq!(over.replicas, 6, "2 x 2.7 / 0.9 = 6: {}", over.why);
        let under = needed(&load(4, 100.0, 0.2, 0.02), &BOTH, None, 60.0, 4, [None, None]);
        assert_eq!(under.replicas, 4, "{}", under.why);
        // Load but no p95 yet (nothing finished in the window): hold.
        let no_p95 = Load {
            ttft_p95: None,
            itl_p95: None,
            ..load(3, 50.0, 0.0, 0.0)
        };
        assert_eq!(needed(&no_p95, &BOTH, None, 60.0, 3, [None, None]).replicas, 3);
        // Idle needs 1 even without a saturated throughput (a schedule window's replicas go back).
        let idle = Load {
            replicas: 3,
            ttft_p95: None,
            itl_p95: None,
            ..Load::default()
        };
        assert_eq!(needed(&idle, &BOTH, None, 60.0, 3, [None, None]).replicas, 1);
    }

    #[test]
    fn idle_needs_one_and_unknown_unloaded_latency_aims_at_seventy_percent() {
        let idle = Load {
            replicas: 3,
            ttft_p95: None,
            itl_p95: None,
            ..Load::default()
        };
        let n = needed(&idle, &BOTH, Some(400.0), 60.0, 3, [None, None]);
        assert_eq!(n.replicas, 1, "{}", n.why);
        let busy = Load {
            replicas: 2,
            token_rate: 700.0,
            ttft_p95: None,
            itl_p95: None,
            ..Load::default()
        };
        // 700 / (400 · 0.7) = 2.5 -> 3.
        assert_eq!(
            needed(&busy, &BOTH, Some(400.0), 60.0, 2, [None, None]).replicas,
            3
        );
    }
}
