//! OpenAI's rate-limit headers, on every answer to a tenant with a request or token limit:
//! `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`, `x-ratelimit-reset-requests` (the
//! time until the bucket is full again, e.g. `1s`, `6m0s`, `20ms`), and the same three for tokens.
//! Values are the fleet-wide buckets' as this request's admission left them.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// (limit per minute, level after admission) of each bucket the tenant has.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RateHeaders {
    pub requests: Option<(u64, f64)>,
    pub tokens: Option<(u64, f64)>,
}

/// A duration as OpenAI writes it: `20ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`.
pub fn duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        let tenths = ms.div_ceil(100);
        return if tenths.is_multiple_of(10) {
            format!("{}s", tenths / 10)
        } else {
            format!("{}.{}s", tenths / 10, tenths % 10)
        };
    }
    let s = ms.div_ceil(1000);
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else {
        format!("{m}m{s}s")
    }
}

/// (remaining, ms until full) of a bucket of `limit` per minute at `level`.
fn state(limit: u64, level: f64) -> (u64, u64) {
    let remaining = level.max(0.0).floor() as u64;
    let missing = (limit as f64 - level).max(0.0);
    (
        remaining.min(limit),
        (missing * 60_000.0 / limit.max(1) as f64).ceil() as u64,
    )
}

impl RateHeaders {
    /// The header pairs.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let mut add = |kind: &str, b: Option<(u64, f64)>| {
            if let Some((limit, level)) = b {
                let (remaining, reset) = state(limit, level);
                let names: [&'static str; 3] = match kind {
                    "requests" => [
                        "x-ratelimit-limit-requests",
                        "x-ratelimit-remaining-requests",
                        "x-ratelimit-reset-requests",
                    ],
                    _ => [
                        "x-ratelimit-limit-tokens",
                        "x-ratelimit-remaining-tokens",
                        "x-ratelimit-reset-tokens",
                    ],
                };
                out.push((names[0], limit.to_string()));
                out.push((names[1], remaining.to_string()));
                out.push((names[2], duration(reset)));
            }
        };
        add("requests", self.requests);
        add("tokens", self.tokens);
        out
    }

    /// Adds them to `h`.
    pub fn apply(&self, h: &mut HeaderMap) {
        for (k, v) in self.pairs() {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.insert(HeaderName::from_static(k), v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_openai() {
        assert_eq!(duration(20), "20ms");
        assert_eq!(duration(1000), "1s");
        assert_eq!(duration(1450), "1.5s");
        assert_eq!(duration(360_000), "6m0s");
        assert_eq!(duration(3_723_000), "1h2m3s");
    }

    #[test]
    fn remaining_and_reset() {
        let h = RateHeaders {
            requests: Some((600, 599.0)),
            tokens: Some((1000, -250.0)),
        };
        let p: Vec<(&str, String)> = h.pairs();
        let get = |k: &str| p.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("x-ratelimit-limit-requests"), "600");
        assert_eq!(get("x-ratelimit-remaining-requests"), "599");
        assert_eq!(get("x-ratelimit-reset-requests"), "100ms");
        assert_eq!(get("x-ratelimit-remaining-tokens"), "0");
        assert_eq!(get("x-ratelimit-reset-tokens"), "1m15s");
        assert!(RateHeaders::default().pairs().is_empty());
    }
}
