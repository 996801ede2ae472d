//! Scaling to and from zero, for ModelDeployments with `autoscaling.minReplicas: 0`.
//!
//! - **From zero**: at 0 replicas, a request the fleet gateway holds for the deployment
//!   (`modelfleet_gateway_pending_requests` > 0) scales it to 1 at once — no up-window: someone is
//!   waiting — and so does a request its `spec.fallback` took elsewhere since the last reading
//!   (`modelfleet_gateway_fallbacks_total{result="moved"}` grew: someone waited, briefly).
//! - **To zero**: a deployment with nothing pending at the gateway, nothing waiting or running on its
//!   pods and no request arriving (the gateway's `modelfleet_gateway_requests_total` unchanged between
//!   readings) is idle; idle for `scaleToZeroAfterSeconds` — its own window, independent of the
//!   scale-down window — it goes to 0. The window's start is `status.autoscaler.idleSince` (kept in the
//!   leader's memory and written with other status writes, like the stabilization windows).
//!
//! Invariants: missing data is never idleness (no reading of the pods or of the gateway → not idle);
//! the first reading of the gateway's counter cannot show that nothing arrived, so the window starts at
//! the second; the gateway only exports demand — the operator alone writes `status.desiredReplicas`.

use super::decide::{Decision, Sample};
use super::gateway::{Demand, read_demand};
use crate::config::GatewayPods;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use modelfleet_crds::model_deployment::{AutoscalerState, AutoscalingSpec};

/// The decision at 0 replicas (`previous_moved`: the gateway's count of requests moved to a fallback
/// at the last reading).
pub fn from_zero(demand: Option<&Demand>, previous_moved: Option<f64>) -> Decision {
    let wake = |reason: String| Decision {
        replicas: 1,
        state: AutoscalerState::default(),
        reason,
    };
    match demand {
        Some(d) if d.pending > 0.0 => wake(format!(
            "scale from zero: {} requests pending at the gateway",
            d.pending.round()
        )),
        Some(d) if previous_moved.is_some_and(|p| d.moved > p) => wake(format!(
            "scale from zero: {} requests moved to a fallback since the last reading",
            (d.moved - previous_moved.unwrap_or_default()).round()
        )),
        _ => Decision {
            replicas: 0,
            state: AutoscalerState::default(),
            reason: "scaled to zero: nothing pending at the gateway".into(),
        },
    }
}

/// Whether nothing is pending, waiting, running or arriving (`previous_requests`: the gateway's counter
/// at the last reading).
pub fn is_idle(sample: Option<&Sample>, demand: Option<&Demand>, previous_requests: Option<f64>) -> bool {
    let pods_idle = sample.is_some_and(|s| s.waiting == 0.0 && s.running == 0.0);
    let gateway_idle = demand.is_some_and(|d| d.pending == 0.0 && previous_requests == Some(d.requests));
    pods_idle && gateway_idle
}

/// Applies the idle window to the autoscaler's `decision` at ≥ 1 replicas: keeps `idleSince` while
/// idle, and goes to 0 once it is `scaleToZeroAfterSeconds` old.
pub fn apply_idle_window(
    decision: &mut Decision,
    spec: &AutoscalingSpec,
    state: &AutoscalerState,
    idle: bool,
    now: Timestamp,
) {
    if !idle {
        decision.state.idle_since = None;
        return;
    }
    let since = state.idle_since.clone().unwrap_or(Time(now));
    let idle_for = now.as_second() - since.0.as_second();
    if idle_for >= i64::from(spec.scale_to_zero_after_seconds) {
        *decision = Decision {
            replicas: 0,
            state: AutoscalerState::default(),
            reason: format!(
                "scale to zero: idle for {idle_for}s (nothing pending, waiting, running or arriving; \
                 scaleToZeroAfterSeconds {})",
                spec.scale_to_zero_after_seconds
            ),
        };
    } else {
        decision.state.idle_since = Some(since);
    }
}

fn ready_ip(p: &Pod) -> Option<String> {
    modelfleet_crds::pods::routable_ip(p).map(str::to_owned)
}

/// Reads the gateway's demand for `ns/name` from every Ready gateway pod (none: zero demand).
pub async fn demand(
    http: &reqwest::Client,
    client: &kube::Client,
    g: &GatewayPods,
    ns: &str,
    name: &str,
) -> Result<Demand, String> {
    let ips = gateway_ips(client, g).await?;
    read_demand(http, &ips, g.metrics_port, ns, name).await
}

/// The IPs of the Ready gateway pods.
pub async fn gateway_ips(client: &kube::Client, g: &GatewayPods) -> Result<Vec<String>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &g.namespace);
    let list = pods
        .list(&ListParams::default().labels(&g.selector))
        .await
        .map_err(|e| format!("listing gateway pods in {}: {e}", g.namespace))?;
    Ok(list.items.iter().filter_map(ready_ip).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(after: i32) -> AutoscalingSpec {
        serde_json::from_value(serde_json::json!({"minReplicas": 0, "scaleToZeroAfterSeconds": after}))
            .unwrap()
    }

    fn demand(pending: f64, requests: f64) -> Demand {
        Demand {
            pending,
            requests,
            moved: 0.0,
            gateways: 1,
        }
    }

    fn sample(waiting: f64, running: f64) -> Sample {
        Sample {
            replicas: 1,
            waiting,
            running,
            kv_mean: 0.0,
            objectives: None,
            lead: None,
        }
    }

    #[test]
    fn pending_demand_wakes_a_deployment_at_once() {
        assert_eq!(from_zero(Some(&demand(2.0, 0.0)), None).replicas, 1);
        assert_eq!(from_zero(Some(&demand(0.0, 9.0)), Some(0.0)).replicas, 0);
        assert_eq!(from_zero(None, Some(0.0)).replicas, 0, "no reading, no wake-up");
    }

    #[test]
    fn requests_moved_to_a_fallback_wake_a_deployment() {
        let moved = |n: f64| Demand {
            moved: n,
            ..demand(0.0, n)
        };
        let woken = from_zero(Some(&moved(3.0)), Some(1.0));
        assert_eq!(woken.replicas, 1);
        assert!(
            woken.reason.contains("2 requests moved to a fallback"),
            "{}",
            woken.reason
        );
        assert_eq!(from_zero(Some(&moved(3.0)), Some(3.0)).replicas, 0, "nothing new");
        assert_eq!(
            from_zero(Some(&moved(3.0)), None).replicas,
            0,
            "a first reading cannot show growth"
        );
    }

    #[test]
    fn idleness_needs_every_signal() {
        let cases = [
            // (sample, demand, previous counter, idle)
            (Some(sample(0.0, 0.0)), Some(demand(0.0, 5.0)), Some(5.0), true),
            (Some(sample(0.0, 0.0)), Some(demand(0.0, 6.0)), Some(5.0), false), // one arrived
            (Some(sample(0.0, 0.0)), Some(demand(0.0, 5.0)), None, false),      // first reading
            (Some(sample(0.0, 0.0)), Some(demand(1.0, 5.0)), Some(5.0), false), // one pending
            (Some(sample(1.0, 0.0)), Some(demand(0.0, 5.0)), Some(5.0), false), // one waiting
            (Some(sample(0.0, 1.0)), Some(demand(0.0, 5.0)), Some(5.0), false), // one running
            (None, Some(demand(0.0, 5.0)), Some(5.0), false),                   // pods unread
            (Some(sample(0.0, 0.0)), None, Some(5.0), false),                   // gateway unread
        ];
        for (i, (s, d, prev, idle)) in cases.into_iter().enumerate() {
            assert_eq!(is_idle(s.as_ref(), d.as_ref(), prev), idle, "case {i}");
        }
    }

    #[test]
    fn the_idle_window_runs_on_its_own() {
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let steady = || Decision {
            replicas: 2,
            state: AutoscalerState::default(),
            reason: "steady".into(),
        };
        let s = spec(60);
        // Idle starts the window; it is kept, not restarted, while idle.
        let mut d = steady();
        apply_idle_window(&mut d, &s, &AutoscalerState::default(), true, t0);
        assert_eq!((d.replicas, d.state.idle_since.clone()), (2, Some(Time(t0))));
        let state = d.state.clone();
        let mut d = steady();
        apply_idle_window(&mut d, &s, &state, true, at(59));
        assert_eq!((d.replicas, d.state.idle_since.clone()), (2, Some(Time(t0))));
        // Any activity ends it.
        let mut d = steady();
        apply_idle_window(&mut d, &s, &state, false, at(59));
        assert_eq!((d.replicas, d.state.idle_since.clone()), (2, None));
        // Idle for the whole window: zero.
        let mut d = steady();
        apply_idle_window(&mut d, &s, &state, true, at(60));
        assert_eq!(d.replicas, 0);
        assert!(d.reason.contains("idle for 60s"), "{}", d.reason);
        assert_eq!(d.state, AutoscalerState::default());
    }
}
