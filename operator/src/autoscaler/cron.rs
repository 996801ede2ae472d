//! Five-field cron expressions (`minute hour day-of-month month day-of-week`), the starts of schedule
//! windows ([`super::schedule`]).
//!
//! Fields: minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or `JAN`-`DEC`, day-of-week 0-7 (0 and
//! 7 are Sunday) or `SUN`-`SAT`; names are case-insensitive. Each field is a comma list of `*`, `a`,
//! `a-b`, `*/n`, `a-b/n` or `a/n` (`a` through the field's maximum, every `n`th). In day-of-week, `*`
//! and `a/n` run through 6 (Saturday): `1/2` is Monday, Wednesday and Friday, not Sunday as well.
//!
//! Day semantics are Vixie cron's: when both day-of-month and day-of-week are restricted (the field
//! does not start with `*`), a day matches when EITHER matches (`0 0 1 * MON`: the 1st and every
//! Monday); otherwise both must (so `*/2` counts as unrestricted, as in Vixie cron and cronie).
//!
//! Invariants: parsing is total over the syntax above and rejects everything else (no silent wrapping
//! or clamping); an error names the field and the offending value; matching is pure bit tests.

use jiff::civil::{Date, DateTime};
use std::str::FromStr;

/// A parsed cron expression: one bitset per field (bit `i` set when value `i` matches).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    /// Bits 0 (Sunday) to 6 (Saturday); a 7 in the expression is folded into bit 0.
    days_of_week: u64,
    /// Whether day-of-month, and day-of-week, are restricted (the field does not start with `*`).
    dom_restricted: bool,
    dow_restricted: bool,
}

/// How to read one field.
struct Field {
    name: &'static str,
    min: u8,
    max: u8,
    /// Where `*` and `a/n` end: `max`, except day-of-week's 6 (7, Sunday again, only when written).
    last: u8,
    /// Names for `min`, `min + 1`, ….
    names: &'static [&'static str],
}

const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    last: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    last: 23,
    names: &[],
};
const DAY_OF_MONTH: Field = Field {
    name: "day-of-month",
    min: 1,
    max: 31,
    last: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    last: 12,
    names: &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ],
};
const DAY_OF_WEEK: Field = Field {
    name: "day-of-week",
    min: 0,
    max: 7,
    last: 6,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
};

impl Cron {
    /// Parses five whitespace-separated fields; the error names the field and the value.
    pub fn parse(expr: &str) -> Result<Cron, String> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let [minute, hour, dom, month, dow] = fields[..] else {
            return Err(format!(
                "{expr:?} has {} fields, expected 5 (minute hour day-of-month month day-of-week)",
                fields.len()
            ));
        };
        let mut days_of_week = DAY_OF_WEEK.parse(dow)?;
        if days_of_week & (1 << 7) != 0 {
            days_of_week = (days_of_week & !(1 << 7)) | 1;
        }
        Ok(Cron {
            minutes: MINUTE.parse(minute)?,
            hours: HOUR.parse(hour)?,
            days_of_month: DAY_OF_MONTH.parse(dom)?,
            months: MONTH.parse(month)?,
            days_of_week,
            dom_restricted: !dom.starts_with('*'),
            dow_restricted: !dow.starts_with('*'),
        })
    }

    /// Whether the civil time `t` (its minute; seconds are ignored) matches.
    pub fn matches(&self, t: &DateTime) -> bool {
        self.matches_minute(t.minute()) && self.matches_hour(t.hour()) && self.matches_date(t.date())
    }

    /// Whether the minute field matches `minute` (0-59).
    pub fn matches_minute(&self, minute: i8) -> bool {
        bit(self.minutes, minute)
    }

    /// Whether the hour field matches `hour` (0-23).
    pub fn matches_hour(&self, hour: i8) -> bool {
        bit(self.hours, hour)
    }

    /// Whether the month, day-of-month and day-of-week fields match `date` (the Vixie OR rule when both
    /// day fields are restricted).
    pub fn matches_date(&self, date: Date) -> bool {
        if !bit(self.months, date.month()) {
            return false;
        }
        let dom = bit(self.days_of_month, date.day());
        let dow = bit(self.days_of_week, date.weekday().to_sunday_zero_offset());
        if self.dom_restricted && self.dow_restricted {
            dom || dow
        } else {
            dom && dow
        }
    }
}

impl FromStr for Cron {
    type Err = String;

    fn from_str(s: &str) -> Result<Cron, String> {
        Cron::parse(s)
    }
}

fn bit(set: u64, i: i8) -> bool {
    (0..64).contains(&i) && (set >> i) & 1 == 1
}

impl Field {
    /// The bitset of a comma list.
    fn parse(&self, text: &str) -> Result<u64, String> {
        text.split(',')
            .try_fold(0u64, |set, element| Ok(set | self.element(element)?))
    }

    /// One list element: `*`, `a`, `a-b`, each optionally `/step`.
    fn element(&self, element: &str) -> Result<u64, String> {
        let (range, step) = match element.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (element, None),
        };
        let (first, last) = if range == "*" {
            (self.min, self.last)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (self.value(a)?, self.value(b)?);
            if a > b {
                return Err(format!(
                    "{}: {element:?} is a range whose start is after its end",
                    self.name
                ));
            }
            (a, b)
        } else {
            let a = self.value(range)?;
            // `a/n` runs from a through the last value; a bare `a` is that value alone.
            (a, if step.is_some() { self.last.max(a) } else { a })
        };
        let step = match step {
            None => 1,
            Some(s) => match s.parse::<u8>() {
                Ok(n) if n > 0 => n,
                _ => {
                    return Err(format!(
                        "{}: {s:?} in {element:?} is not a step (1 or more)",
                        self.name
                    ));
                }
            },
        };
        Ok((first..=last)
            .step_by(usize::from(step))
            .fold(0, |set, v| set | 1 << v))
    }

    /// A number in range, or a name.
    fn value(&self, text: &str) -> Result<u8, String> {
        if let Some(i) = self.names.iter().position(|n| n.eq_ignore_ascii_case(text)) {
            return Ok(self.min + i as u8);
        }
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            let names = match (self.names.first(), self.names.last()) {
                (Some(first), Some(last)) => format!(" or a name ({first}-{last})"),
                _ => String::new(),
            };
            return Err(format!("{}: {text:?} is not a number{names}", self.name));
        }
        match text.parse::<u8>() {
            Ok(v) if (self.min..=self.max).contains(&v) => Ok(v),
            _ => Err(format!(
                "{}: {text:?} is out of {}-{}",
                self.name, self.min, self.max
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn cron(s: &str) -> Cron {
        Cron::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    /// The values of a bitset, for readable assertions.
    fn values(set: u64) -> Vec<u8> {
        (0..64).filter(|i| set >> i & 1 == 1).collect()
    }

    #[test]
    fn every_syntax_parses_to_its_values() {
        let c = cron("*/15 8-10,22 1-31/10 JAN-mar,dec 1/2");
        assert_eq!(values(c.minutes), [0, 15, 30, 45]);
        assert_eq!(values(c.hours), [8, 9, 10, 22]);
        assert_eq!(values(c.days_of_month), [1, 11, 21, 31]);
        assert_eq!(values(c.months), [1, 2, 3, 12]);
        assert_eq!(values(c.days_of_week), [1, 3, 5]);
        let c = cron("5 0 * * *");
        assert_eq!(values(c.minutes), [5]);
        assert_eq!(values(c.hours), [0]);
        assert_eq!(values(c.days_of_month), (1..=31).collect::<Vec<_>>());
        assert_eq!(values(c.months), (1..=12).collect::<Vec<_>>());
        assert_eq!(values(c.days_of_week), (0..=6).collect::<Vec<_>>());
        assert_eq!(values(cron("50/5 * * * *").minutes), [50, 55]);
        assert_eq!(values(cron("0 0 * * 1-5/2").days_of_week), [1, 3, 5]);
        assert_eq!(values(cron("0 0 * * 1-7/2").days_of_week), [0, 1, 3, 5]);
        assert_eq!(values(cron("0 0 * * 7/2").days_of_week), [0]);
        assert_eq!("0 0 * * *".parse::<Cron>(), Ok(cron("0 0 * * *")));
    }

    #[test]
    fn day_of_week_names_and_seven_are_sunday() {
        assert_eq!(values(cron("0 0 * * 7").days_of_week), [0]);
        assert_eq!(values(cron("0 0 * * 0").days_of_week), [0]);
        assert_eq!(values(cron("0 0 * * sun").days_of_week), [0]);
        assert_eq!(values(cron("0 0 * * FRI-7").days_of_week), [0, 5, 6]);
        assert_eq!(values(cron("0 0 * * Mon-Fri").days_of_week), [1, 2, 3, 4, 5]);
        assert_eq!(values(cron("0 0 * * SAT,SUN").days_of_week), [0, 6]);
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        let cases = [
            ("0 0 * * 8", r#"day-of-week: "8" is out of 0-7"#),
            ("60 0 * * *", r#"minute: "60" is out of 0-59"#),
            ("0 24 * * *", r#"hour: "24" is out of 0-23"#),
            ("0 0 0 * *", r#"day-of-month: "0" is out of 1-31"#),
            ("0 0 * 13 *", r#"month: "13" is out of 1-12"#),
            ("0 0 * 1-99999 *", r#"month: "99999" is out of 1-12"#),
            (
                "0 0 * FOO *",
                r#"month: "FOO" is not a number or a name (JAN-DEC)"#,
            ),
            ("MON 0 * * *", r#"minute: "MON" is not a number"#),
            (
                "0 0 * * MONDAY",
                r#"day-of-week: "MONDAY" is not a number or a name (SUN-SAT)"#,
            ),
            (
                "0 0 * JAN *x",
                r#"day-of-week: "*x" is not a number or a name (SUN-SAT)"#,
            ),
            (
                "0 10-2 * * *",
                r#"hour: "10-2" is a range whose start is after its end"#,
            ),
            ("*/0 * * * *", r#"minute: "0" in "*/0" is not a step (1 or more)"#),
            ("*/x * * * *", r#"minute: "x" in "*/x" is not a step (1 or more)"#),
            ("1,,2 * * * *", r#"minute: "" is not a number"#),
            ("-1 * * * *", r#"minute: "" is not a number"#),
            (
                "0 0 * *",
                r#""0 0 * *" has 4 fields, expected 5 (minute hour day-of-month month day-of-week)"#,
            ),
            (
                "0 0 * * * *",
                r#""0 0 * * * *" has 6 fields, expected 5 (minute hour day-of-month month day-of-week)"#,
            ),
        ];
        for (expr, want) in cases {
            assert_eq!(Cron::parse(expr), Err(want.to_string()), "{expr}");
        }
    }

    #[test]
    fn restricted_day_fields_match_either_otherwise_both() {
        // 2025-06-01 is a Sunday, 2025-06-02 a Monday, 2025-06-03 a Tuesday.
        let (sun_1st, mon_2nd, tue_3rd) = (date(2025, 6, 1), date(2025, 6, 2), date(2025, 6, 3));
        let either = cron("0 0 1 * MON");
        assert!(either.matches_date(sun_1st));
        assert!(either.matches_date(mon_2nd));
        assert!(!either.matches_date(tue_3rd));
        let dom_only = cron("0 0 1 * *");
        assert!(dom_only.matches_date(sun_1st));
        assert!(!dom_only.matches_date(mon_2nd));
        let dow_only = cron("0 0 * * MON");
        assert!(!dow_only.matches_date(sun_1st));
        assert!(dow_only.matches_date(mon_2nd));
        // A field starting with `*` is unrestricted (Vixie cron): both must match.
        let starred = cron("0 0 */2 * MON");
        assert!(!starred.matches_date(sun_1st));
        assert!(!starred.matches_date(mon_2nd));
        assert!(starred.matches_date(date(2025, 6, 9)), "Monday the 9th");
        // The month always has to match.
        assert!(!cron("0 0 1 JUL MON").matches_date(mon_2nd));
    }

    #[test]
    fn matches_minute_hour_and_date() {
        let c = cron("30 8 * * MON-FRI");
        assert!(c.matches(&date(2025, 6, 2).at(8, 30, 0, 0)));
        assert!(c.matches(&date(2025, 6, 2).at(8, 30, 59, 0)));
        assert!(!c.matches(&date(2025, 6, 2).at(8, 31, 0, 0)));
        assert!(!c.matches(&date(2025, 6, 2).at(9, 30, 0, 0)));
        assert!(!c.matches(&date(2025, 6, 7).at(8, 30, 0, 0)), "Saturday");
    }
}
