//! The latency objectives and schedule windows of `spec.autoscaling`, and the durations they are
//! written in.
//!
//! Durations are Go's (`kubectl`'s, Argo's, Flux's) format without signs: one or more `<number><unit>`
//! with units `ms`, `s`, `m`, `h` (`"800ms"`, `"1s"`, `"1.5s"`, `"1h30m"`). The schema checks the shape;
//! [`parse_duration`] is what the operator reads them with.
//!
//! A schedule window is a cron start (five fields, minute hour day-of-month month day-of-week, in the
//! window's time zone), a duration, and the replica bounds that hold while it is open. The schema checks
//! the shapes; the operator parses the cron expression and the time zone, and a window it cannot read
//! stops autoscaling with `ScalingActive=False` (`InvalidSchedule`) and the field named, holding the
//! current count.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A duration: `<number><unit>` pieces, units `ms`, `s`, `m`, `h`.
pub const DURATION_PATTERN: &str = r"^([0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h))+$";

/// Latency objectives the autoscaler holds (each optional; all that are set are met).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.ttftP95) || has(self.itlP95)").message("autoscaling.objectives needs ttftP95 or itlP95").field_path(".ttftP95"))]
pub struct Objectives {
    /// 95th percentile of time to first token to hold, e.g. `"1s"` (queueing and prefill included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = DURATION_PATTERN))]
    pub ttft_p95: Option<String>,
    /// 95th percentile of inter-token latency to hold, e.g. `"80ms"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = DURATION_PATTERN))]
    pub itl_p95: Option<String>,
    /// Seconds of history the percentiles, the arrival rate and the prompt and output lengths are
    /// measured over.
    #[serde(default = "default_objective_window")]
    #[schemars(range(min = 10, max = 3600))]
    pub window_seconds: i32,
}

fn default_objective_window() -> i32 {
    60
}

/// A recurring window with its own replica bounds (`spec.autoscaling.schedule[]`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.minReplicas) || has(self.maxReplicas)").message("a schedule window needs minReplicas or maxReplicas").field_path(".minReplicas"))]
#[x_kube(validation = Rule::new("!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas").message("a schedule window's minReplicas must be <= its maxReplicas").field_path(".minReplicas"))]
pub struct ScheduleWindow {
    /// A name for status and Events, e.g. `night`.
    #[schemars(length(min = 1, max = 63), regex(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// When the window opens: five cron fields (minute hour day-of-month month day-of-week; `*`, lists,
    /// ranges, steps, `MON`–`SUN`, `JAN`–`DEC`), e.g. `"30 8 * * MON-FRI"`.
    #[schemars(length(min = 9, max = 128), regex(pattern = r"^\S+( +\S+){4}$"))]
    pub start: String,
    /// How long it stays open, e.g. `"5h"` (at most 7 days).
    #[schemars(length(max = 32), regex(pattern = DURATION_PATTERN))]
    pub duration: String,
    /// IANA time zone the cron fields are read in, e.g. `Europe/Paris`.
    #[serde(default = "default_time_zone")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: String,
    /// Fewest replicas while open; reached before the window opens (lead time: the measured time for a
    /// new pod to become Ready, plus two autoscaler passes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub min_replicas: Option<i32>,
    /// Most replicas while open. `0` lets the deployment rest at zero: at most 1 replica while the
    /// window is open, 0 once idle for `scaleToZeroAfterSeconds`, and a request through the gateway
    /// still wakes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub max_replicas: Option<i32>,
}

fn default_time_zone() -> String {
    "UTC".into()
}

/// What the objectives autoscaler measured and concluded (`status.objectives`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectivesStatus {
    /// Measured p95 time to first token against its objective, e.g. `"420ms / 1s"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_p95: Option<String>,
    /// Measured p95 inter-token latency against its objective, e.g. `"35ms / 80ms"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_p95: Option<String>,
    /// Requests arriving per second, fleet-wide (3 significant digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival_rate: Option<String>,
    /// Replicas the capacity model says meet every objective now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed_replicas: Option<i32>,
    /// Schedule windows open now (or opening within the lead time), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub schedule_windows: Vec<String>,
    /// The model's reasoning, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub message: String,
}

/// Parses a [`DURATION_PATTERN`] duration; the error names what is wrong.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        Err(format!(
            "{s:?} is not a duration ({why}; e.g. \"800ms\", \"1s\", \"1h30m\")"
        ))
    };
    if s.is_empty() {
        return bad("empty");
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let Ok(value) = rest[..digits].parse::<f64>() else {
            return bad("a number must come before each unit");
        };
        rest = &rest[digits..];
        let (unit, seconds) = if let Some(r) = rest.strip_prefix("ms") {
            (r, 1e-3)
        } else if let Some(r) = rest.strip_prefix('s') {
            (r, 1.0)
        } else if let Some(r) = rest.strip_prefix('m') {
            (r, 60.0)
        } else if let Some(r) = rest.strip_prefix('h') {
            (r, 3600.0)
        } else {
            return bad("units are ms, s, m and h");
        };
        rest = unit;
        total += value * seconds;
    }
    if !total.is_finite() || total > 1e9 {
        return bad("too long");
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = |s: &str, secs: f64| assert_eq!(parse_duration(s), Ok(Duration::from_secs_f64(secs)), "{s}");
        ok("800ms", 0.8);
        ok("1s", 1.0);
        ok("1.5s", 1.5);
        ok("1h30m", 5400.0);
        ok("2m3s", 123.0);
        ok("0s", 0.0);
        for bad in ["", "1", "s", "1d", "1 s", "-1s", "1s2", "1.2.3s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }
}
