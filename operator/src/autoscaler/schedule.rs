//! Schedule windows (`spec.autoscaling.schedule[]`): the replica bounds they put in force at an
//! instant, pure.
//!
//! - A window starts at every minute its cron expression ([`super::cron`]) matches in its time zone, at
//!   second 0, and stays open for its `duration` (more than 0, at most 7 days): it is open at `t` when
//!   some start `s` has `s <= t < s + duration` (overlapping openings run together).
//! - Daylight saving time: a local minute skipped by a spring-forward gap is never a start (`30 2 * * *`
//!   in `Europe/Paris` does not open on the last Sunday of March); a local minute repeated at fall-back is
//!   a start twice (it opens twice on the last Sunday of October).
//! - `minReplicas` applies from `lead` before the window opens, so the rise is complete when it opens:
//!   at `t` when the window is open at any instant of `[t, t + lead]`. `maxReplicas` applies only while
//!   the window is open, never early.
//! - min = max(`spec.minReplicas`, every applying `minReplicas`); max = min(`spec.maxReplicas`, every
//!   open `maxReplicas`). When they cross (a window's minimum above `spec.maxReplicas`, or overlapping
//!   windows that disagree) the max wins — a cap is what a user sets to bound spend.
//! - An open window with `maxReplicas: 0` gives bounds (0, 0): the deployment may rest at zero (the
//!   caller scales it to zero once idle, and still wakes one replica for a request).
//!
//! Invariants: `min <= max <= spec.maxReplicas`; the bounds depend only on the spec, the instant and the
//! lead (time zones come from the IANA database bundled into the binary, not the host's); a window that
//! cannot be read is an error naming its field (`spec.autoscaling.schedule[2].start: …`), never skipped.

use super::cron::Cron;
use jiff::tz::{TimeZone, TimeZoneDatabase};
use jiff::{SignedDuration, Timestamp};
use modelfleet_crds::autoscaling::{ScheduleWindow, parse_duration};
use modelfleet_crds::model_deployment::AutoscalingSpec;
use std::time::Duration;

// The operator's timestamps (k8s-openapi's jiff) are this module's: one jiff in the build.
const _: fn(k8s_openapi::jiff::Timestamp) -> Timestamp = |t| t;

/// The longest `duration` a window may have.
const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The replica bounds the schedule puts in force at `now`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// Fewest replicas.
    pub min: i32,
    /// Most replicas; (0, 0) means "rest at zero".
    pub max: i32,
    /// Names of the windows in force (open now, or opening within `lead` for a `minReplicas`), in spec
    /// order.
    pub open: Vec<String>,
}

/// The bounds at `now`: the spec's `minReplicas`/`maxReplicas` narrowed by the windows in force, with
/// minimums applying `lead` early. Errors name the window's field.
pub fn bounds(spec: &AutoscalingSpec, now: Timestamp, lead: Duration) -> Result<Scheduled, String> {
    let mut min = spec.min_replicas;
    let mut max = spec.max_replicas;
    let mut open = Vec::new();
    for (i, window) in spec.schedule.iter().enumerate() {
        let parsed = Window::read(window)
            .map_err(|(field, e)| format!("spec.autoscaling.schedule[{i}].{field}: {e}"))?;
        let Some(start) = parsed.first_start(now, lead) else {
            continue;
        };
        let is_open = start <= now;
        if let Some(window_min) = window.min_replicas {
            min = min.max(window_min.min(spec.max_replicas));
        }
        if let (true, Some(window_max)) = (is_open, window.max_replicas) {
            max = max.min(window_max);
        }
        if is_open || window.min_replicas.is_some() {
            open.push(window.name.clone());
        }
    }
    let max = max.max(0);
    Ok(Scheduled {
        min: min.clamp(0, max),
        max,
        open,
    })
}

/// A window's start, duration and time zone, read.
struct Window {
    cron: Cron,
    duration: SignedDuration,
    tz: TimeZone,
}

impl Window {
    /// Parses `window`; the error is the field's name (as in the resource) and what is wrong.
    fn read(window: &ScheduleWindow) -> Result<Window, (&'static str, String)> {
        let cron = Cron::parse(&window.start).map_err(|e| ("start", e))?;
        let duration = parse_duration(&window.duration).map_err(|e| ("duration", e))?;
        if duration.is_zero() {
            return Err(("duration", format!("{:?} must be more than 0", window.duration)));
        }
        if duration > MAX_DURATION {
            return Err((
                "duration",
                format!("{:?} is longer than 7 days (168h)", window.duration),
            ));
        }
        let duration = SignedDuration::try_from(duration).map_err(|e| ("duration", e.to_string()))?;
        // The bundled database explicitly: `TimeZone::get` would prefer the host's /usr/share/zoneinfo.
        let tz = TimeZoneDatabase::bundled()
            .get(&window.time_zone)
            .map_err(|_| ("timeZone", format!("unknown time zone {:?}", window.time_zone)))?;
        Ok(Window { cron, duration, tz })
    }

    /// The earliest start `s` with `now - duration < s <= now + lead`: the window is open at some
    /// instant of `[now, now + lead]` exactly when there is one, and open at `now` when it is `<= now`.
    fn first_start(&self, now: Timestamp, lead: Duration) -> Option<Timestamp> {
        let lead = SignedDuration::try_from(lead).ok()?;
        let after = floor_second(now.checked_sub(self.duration).ok()?);
        let until = floor_second(now.checked_add(lead).ok()?);
        let start = first_start_between(&self.cron, &self.tz, after + 1, until)?;
        Timestamp::from_second(start).ok()
    }
}

/// Whole seconds since the Unix epoch, rounded down.
fn floor_second(t: Timestamp) -> i64 {
    t.as_second() - i64::from(t.subsec_nanosecond() < 0)
}

/// The first start of `cron` in `tz` within Unix seconds `[from, to]`: walks the stretches of constant
/// UTC offset between the zone's transitions, so a gap's local minutes never occur and a fall-back's
/// occur twice.
fn first_start_between(cron: &Cron, tz: &TimeZone, from: i64, to: i64) -> Option<i64> {
    let mut at = from;
    while at <= to {
        let ts = Timestamp::from_second(at).ok()?;
        let offset = i64::from(tz.to_offset(ts).seconds());
        let end = match tz.following(ts).next() {
            Some(transition) => (transition.timestamp().as_second() - 1).min(to),
            None => to,
        };
        if let Some(local) = first_local_match(cron, at + offset, end + offset) {
            return Some(local - offset);
        }
        at = end + 1;
    }
    None
}

/// The first whole minute within local seconds `[from, to]` (seconds since the epoch of the local
/// calendar) that `cron` matches, skipping whole days and hours that cannot match.
fn first_local_match(cron: &Cron, from: i64, to: i64) -> Option<i64> {
    const DAY: i64 = 86_400;
    let mut minute = from.div_euclid(60) * 60;
    if minute < from {
        minute += 60;
    }
    let mut day_checked: Option<(i64, bool)> = None;
    while minute <= to {
        let day = minute.div_euclid(DAY);
        let day_matches = match day_checked {
            Some((d, matches)) if d == day => matches,
            _ => {
                let date = TimeZone::UTC
                    .to_datetime(Timestamp::from_second(day * DAY).ok()?)
                    .date();
                let matches = cron.matches_date(date);
                day_checked = Some((day, matches));
                matches
            }
        };
        let of_day = minute - day * DAY;
        let (hour, minute_of_hour) = ((of_day / 3600) as i8, (of_day % 3600 / 60) as i8);
        if !day_matches {
            minute = (day + 1) * DAY;
        } else if !cron.matches_hour(hour) {
            minute = day * DAY + (i64::from(hour) + 1) * 3600;
        } else if cron.matches_minute(minute_of_hour) {
            return Some(minute);
        } else {
            minute += 60;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::{DateTime, date};
    use serde_json::json;

    const SECOND: Duration = Duration::from_secs(1);

    fn spec(min: i32, max: i32, windows: serde_json::Value) -> AutoscalingSpec {
        serde_json::from_value(json!({ "minReplicas": min, "maxReplicas": max, "schedule": windows }))
            .expect("a valid AutoscalingSpec")
    }

    /// The instant of the local civil time `t` in `zone` (the earlier one when repeated).
    fn at(t: DateTime, zone: &str) -> k8s_openapi::jiff::Timestamp {
        t.in_tz(zone).unwrap().timestamp()
    }

    fn utc(t: DateTime) -> Timestamp {
        at(t, "UTC")
    }

    fn ok(spec: &AutoscalingSpec, now: Timestamp, lead: Duration) -> (i32, i32, Vec<String>) {
        let s = bounds(spec, now, lead).unwrap();
        (s.min, s.max, s.open)
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    fn morning() -> AutoscalingSpec {
        spec(
            1,
            10,
            json!([{ "name": "morning", "start": "30 8 * * MON-FRI", "duration": "10h",
            "timeZone": "Europe/Paris", "minReplicas": 4 }]),
        )
    }

    #[test]
    fn a_weekday_morning_window_raises_the_minimum() {
        let s = morning();
        let paris = |h, m, sec| at(date(2025, 6, 2).at(h, m, sec, 0), "Europe/Paris"); // a Monday
        let shut = (1, 10, vec![]);
        let open = (4, 10, names(&["morning"]));
        assert_eq!(ok(&s, paris(8, 29, 59), Duration::ZERO), shut);
        assert_eq!(ok(&s, paris(8, 30, 0), Duration::ZERO), open);
        assert_eq!(ok(&s, paris(12, 0, 0), Duration::ZERO), open);
        assert_eq!(ok(&s, paris(18, 29, 59), Duration::ZERO), open);
        assert_eq!(ok(&s, paris(18, 30, 0), Duration::ZERO), shut);
        // 08:30 Paris is 06:30 UTC in June: the zone is honoured.
        assert_eq!(
            ok(&s, utc(date(2025, 6, 2).at(8, 30, 0, 0)), Duration::ZERO),
            open
        );
        assert_eq!(
            ok(&s, utc(date(2025, 6, 2).at(6, 29, 0, 0)), Duration::ZERO),
            shut
        );
        let saturday = at(date(2025, 6, 7).at(12, 0, 0, 0), "Europe/Paris");
        assert_eq!(ok(&s, saturday, Duration::ZERO), shut);
    }

    #[test]
    fn a_minimum_applies_lead_early() {
        let s = morning();
        let paris = |h, m, sec| at(date(2025, 6, 2).at(h, m, sec, 0), "Europe/Paris");
        let lead = 90 * SECOND;
        assert_eq!(ok(&s, paris(8, 28, 29), lead), (1, 10, vec![]));
        assert_eq!(ok(&s, paris(8, 28, 30), lead), (4, 10, names(&["morning"])));
        assert_eq!(ok(&s, paris(8, 28, 31), lead), (4, 10, names(&["morning"])));
        assert_eq!(ok(&s, paris(8, 28, 31), Duration::ZERO), (1, 10, vec![]));
        // The lead does not keep the window after it closes.
        assert_eq!(ok(&s, paris(18, 30, 0), lead), (1, 10, vec![]));
        // Friday evening's lead does not reach Monday.
        let friday = at(date(2025, 6, 6).at(23, 0, 0, 0), "Europe/Paris");
        assert_eq!(ok(&s, friday, 3600 * SECOND), (1, 10, vec![]));
    }

    #[test]
    fn a_maximum_applies_only_while_open() {
        let s = spec(
            1,
            10,
            json!([{ "name": "night", "start": "0 1 * * *", "duration": "5h", "maxReplicas": 1 }]),
        );
        let t = |d, h, m| utc(date(2025, 6, d).at(h, m, 0, 0));
        assert_eq!(ok(&s, t(2, 0, 59), 3600 * SECOND), (1, 10, vec![]), "never early");
        assert_eq!(ok(&s, t(2, 1, 0), Duration::ZERO), (1, 1, names(&["night"])));
        assert_eq!(ok(&s, t(2, 5, 59), Duration::ZERO), (1, 1, names(&["night"])));
        assert_eq!(ok(&s, t(2, 6, 0), Duration::ZERO), (1, 10, vec![]));
    }

    #[test]
    fn a_night_window_crosses_midnight() {
        // Opens at 22:00 UTC for 5h: 22:00-03:00, across the date change.
        let s = spec(
            2,
            10,
            json!([{ "name": "night", "start": "0 22 * * *", "duration": "5h", "maxReplicas": 1 }]),
        );
        let t = |d, h, m| utc(date(2025, 6, d).at(h, m, 0, 0));
        assert_eq!(ok(&s, t(2, 21, 59), Duration::ZERO), (2, 10, vec![]));
        assert_eq!(ok(&s, t(2, 23, 30), Duration::ZERO), (1, 1, names(&["night"])));
        assert_eq!(ok(&s, t(3, 2, 59), Duration::ZERO), (1, 1, names(&["night"])));
        assert_eq!(ok(&s, t(3, 3, 0), Duration::ZERO), (2, 10, vec![]));
        // `0 1 * * *` for 5h in Paris (winter, UTC+1): 00:00-05:00 UTC, i.e. from the previous UTC day's
        // midnight.
        let s = spec(
            1,
            10,
            json!([{ "name": "night", "start": "0 1 * * *", "duration": "5h",
            "timeZone": "Europe/Paris", "maxReplicas": 1 }]),
        );
        let t = |d, h, m| utc(date(2025, 1, d).at(h, m, 0, 0));
        assert_eq!(ok(&s, t(14, 23, 59), Duration::ZERO).1, 10);
        assert_eq!(ok(&s, t(15, 0, 0), Duration::ZERO).1, 1);
        assert_eq!(ok(&s, t(15, 4, 59), Duration::ZERO).1, 1);
        assert_eq!(ok(&s, t(15, 5, 0), Duration::ZERO).1, 10);
    }

    #[test]
    fn overlapping_windows_the_max_wins() {
        let s = spec(
            1,
            10,
            json!([
                { "name": "busy", "start": "0 8 * * *", "duration": "10h", "minReplicas": 6 },
                { "name": "cheap", "start": "0 12 * * *", "duration": "2h", "maxReplicas": 3 },
                { "name": "batch", "start": "0 9 * * *", "duration": "1h", "minReplicas": 2, "maxReplicas": 8 },
            ]),
        );
        let t = |h, m| utc(date(2025, 6, 2).at(h, m, 0, 0));
        assert_eq!(
            ok(&s, t(9, 30), Duration::ZERO),
            (6, 8, names(&["busy", "batch"]))
        );
        assert_eq!(ok(&s, t(11, 0), Duration::ZERO), (6, 10, names(&["busy"])));
        assert_eq!(
            ok(&s, t(12, 0), Duration::ZERO),
            (3, 3, names(&["busy", "cheap"]))
        );
        assert_eq!(ok(&s, t(14, 0), Duration::ZERO), (6, 10, names(&["busy"])));
        // A window whose maximum is ahead is not in force early, only one with a minimum.
        assert_eq!(ok(&s, t(11, 59), 120 * SECOND), (6, 10, names(&["busy"])));
        assert_eq!(ok(&s, t(7, 59), 120 * SECOND), (6, 10, names(&["busy"])));
    }

    #[test]
    fn a_max_zero_window_rests_at_zero() {
        let s = spec(
            2,
            10,
            json!([
                { "name": "weekend", "start": "0 0 * * SAT", "duration": "48h", "maxReplicas": 0 },
                { "name": "demo", "start": "0 10 * * *", "duration": "1h", "minReplicas": 5 },
            ]),
        );
        let saturday = utc(date(2025, 6, 7).at(10, 30, 0, 0));
        assert_eq!(
            ok(&s, saturday, Duration::ZERO),
            (0, 0, names(&["weekend", "demo"]))
        );
        let friday = utc(date(2025, 6, 6).at(10, 30, 0, 0));
        assert_eq!(ok(&s, friday, Duration::ZERO), (5, 10, names(&["demo"])));
    }

    #[test]
    fn spec_bounds_cap_window_bounds() {
        let s = spec(
            3,
            5,
            json!([
                { "name": "big", "start": "0 8 * * *", "duration": "1h", "minReplicas": 20, "maxReplicas": 30 },
                { "name": "low", "start": "0 10 * * *", "duration": "1h", "minReplicas": 1, "maxReplicas": 4 },
            ]),
        );
        assert_eq!(
            ok(&s, utc(date(2025, 6, 2).at(8, 0, 0, 0)), Duration::ZERO),
            (5, 5, names(&["big"]))
        );
        assert_eq!(
            ok(&s, utc(date(2025, 6, 2).at(10, 0, 0, 0)), Duration::ZERO),
            (3, 4, names(&["low"]))
        );
        assert_eq!(
            ok(&s, utc(date(2025, 6, 2).at(9, 0, 0, 0)), Duration::ZERO),
            (3, 5, vec![])
        );
    }

    /// Minutes of the local day `d` in Paris at which a `30 2 * * *`, 30m window is open.
    fn open_minutes_in_paris(d: jiff::civil::Date) -> Vec<Timestamp> {
        let s = spec(
            1,
            10,
            json!([{ "name": "w", "start": "30 2 * * *", "duration": "30m",
            "timeZone": "Europe/Paris", "maxReplicas": 1 }]),
        );
        let first = at(d.at(0, 0, 0, 0), "Europe/Paris");
        let last = at(d.tomorrow().unwrap().at(0, 0, 0, 0), "Europe/Paris");
        std::iter::successors(Some(first), |t| Some(*t + SignedDuration::from_mins(1)))
            .take_while(|t| *t < last)
            .filter(|t| ok(&s, *t, Duration::ZERO).1 == 1)
            .collect()
    }

    #[test]
    fn a_spring_forward_gap_skips_the_start() {
        // 2025-03-30: Paris goes from 02:00 CET to 03:00 CEST; 02:30 does not exist.
        assert_eq!(open_minutes_in_paris(date(2025, 3, 30)), vec![]);
        // The days around it open for 30 minutes from 02:30 local.
        let before = open_minutes_in_paris(date(2025, 3, 29));
        assert_eq!(before.len(), 30);
        assert_eq!(before[0], utc(date(2025, 3, 29).at(1, 30, 0, 0)));
        let after = open_minutes_in_paris(date(2025, 3, 31));
        assert_eq!(after.len(), 30);
        assert_eq!(after[0], utc(date(2025, 3, 31).at(0, 30, 0, 0)));
    }

    #[test]
    fn a_fall_back_repeat_opens_twice() {
        // 2025-10-26: Paris goes from 03:00 CEST back to 02:00 CET; 02:30 happens at 00:30 and 01:30 UTC.
        let open = open_minutes_in_paris(date(2025, 10, 26));
        assert_eq!(open.len(), 60);
        assert_eq!(open[0], utc(date(2025, 10, 26).at(0, 30, 0, 0)));
        assert_eq!(open[29], utc(date(2025, 10, 26).at(0, 59, 0, 0)));
        assert_eq!(open[30], utc(date(2025, 10, 26).at(1, 30, 0, 0)));
        assert_eq!(open[59], utc(date(2025, 10, 26).at(1, 59, 0, 0)));
    }

    #[test]
    fn unreadable_windows_are_errors_naming_the_field() {
        let window = |start: &str, duration: &str, zone: &str| json!({ "name": "w", "start": start, "duration": duration, "timeZone": zone, "minReplicas": 1 });
        let ok_window = window("0 8 * * *", "1h", "UTC");
        let cases = [
            (
                window("0 8 * * *", "1h", "Mars/Base"),
                r#"[1].timeZone: unknown time zone "Mars/Base""#,
            ),
            (
                window("0 8 * * 8", "1h", "UTC"),
                r#"[1].start: day-of-week: "8" is out of 0-7"#,
            ),
            (
                window("0 8 * *", "1h", "UTC"),
                r#"[1].start: "0 8 * *" has 4 fields, expected 5"#,
            ),
            (
                window("0 8 * * *", "0s", "UTC"),
                r#"[1].duration: "0s" must be more than 0"#,
            ),
            (
                window("0 8 * * *", "168h1s", "UTC"),
                r#"[1].duration: "168h1s" is longer than 7 days (168h)"#,
            ),
            (
                window("0 8 * * *", "1d", "UTC"),
                r#"[1].duration: "1d" is not a duration"#,
            ),
        ];
        let now = utc(date(2025, 6, 2).at(12, 0, 0, 0));
        for (bad, want) in cases {
            let err = bounds(&spec(1, 10, json!([ok_window, bad])), now, Duration::ZERO).unwrap_err();
            let want = format!("spec.autoscaling.schedule{want}");
            assert!(err.starts_with(&want), "{err:?} does not start with {want:?}");
        }
        assert!(
            bounds(
                &spec(1, 10, json!([ok_window, window("0 8 * * *", "168h", "UTC")])),
                now,
                Duration::ZERO
            )
            .is_ok()
        );
    }

    #[test]
    fn time_zones_are_bundled_and_the_default_is_utc() {
        let s = spec(
            1,
            10,
            json!([{ "name": "w", "start": "0 12 * * *", "duration": "1h", "minReplicas": 2 }]),
        );
        assert_eq!(ok(&s, utc(date(2025, 6, 2).at(12, 0, 0, 0)), Duration::ZERO).0, 2);
        assert_eq!(
            ok(
                &s,
                at(date(2025, 6, 2).at(12, 0, 0, 0), "Asia/Tokyo"),
                Duration::ZERO
            )
            .0,
            1
        );
        assert!(TimeZoneDatabase::bundled().get("Asia/Kathmandu").is_ok());
        // Kathmandu is UTC+05:45: 12:00 local is 06:15 UTC.
        let s = spec(
            1,
            10,
            json!([{ "name": "w", "start": "0 12 * * *", "duration": "1m",
            "timeZone": "Asia/Kathmandu", "minReplicas": 2 }]),
        );
        assert_eq!(
            ok(&s, utc(date(2025, 6, 2).at(6, 15, 30, 0)), Duration::ZERO).0,
            2
        );
        assert_eq!(
            ok(&s, utc(date(2025, 6, 2).at(6, 14, 59, 0)), Duration::ZERO).0,
            1
        );
    }

    #[test]
    fn a_long_window_is_found_days_after_its_start() {
        // Mondays 00:00 for 100h: open until Friday 04:00. 2025-06-02 is a Monday.
        let s = spec(
            1,
            10,
            json!([{ "name": "w", "start": "0 0 * * MON", "duration": "100h",
            "timeZone": "America/New_York", "minReplicas": 2 }]),
        );
        let ny = |d, h, m| at(date(2025, 6, d).at(h, m, 0, 0), "America/New_York");
        assert_eq!(ok(&s, ny(1, 23, 59), Duration::ZERO).0, 1);
        assert_eq!(ok(&s, ny(2, 0, 0), Duration::ZERO).0, 2);
        assert_eq!(ok(&s, ny(5, 4, 0), Duration::ZERO).0, 2);
        assert_eq!(ok(&s, ny(6, 3, 59), Duration::ZERO).0, 2);
        assert_eq!(ok(&s, ny(6, 4, 0), Duration::ZERO).0, 1);
        assert_eq!(
            ok(&s, ny(8, 23, 0), 3600 * SECOND).0,
            2,
            "next Monday, within the lead"
        );
    }
}
