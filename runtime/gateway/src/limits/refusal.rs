//! The answers of a refused request: 429 with `Retry-After` naming the limit (`rate_limit_exceeded`,
//! `tenant_quota`, or `insufficient_quota` for a spent budget, as OpenAI answers), and the money format.

use super::Who;
use super::headers::{self, RateHeaders};
use modelfleet_api::error::{ApiError, ApiErrorKind};
use modelfleet_api::limits::MICROS;
use modelfleet_api::tenants::Tenant;

/// A refusal, with the `x-ratelimit-*` values to answer it with.
#[derive(Debug)]
pub struct Refused {
    pub error: ApiError,
    pub headers: RateHeaders,
}

impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Refused {
        Refused {
            error,
            headers: RateHeaders::default(),
        }
    }
}

pub(super) fn refused(who: &Who, tenant: &Tenant, reason: &str, wait_ms: u64, currency: &str) -> ApiError {
    let l = &tenant.limits;
    let secs = wait_ms.div_ceil(1000).clamp(1, u32::MAX as u64) as u32;
    let wait = headers::duration(wait_ms);
    let t = &who.tenant;
    let (code, message) = match reason {
        "daily_budget" | "monthly_budget" => {
            let (period, budget) = if reason == "daily_budget" {
                ("daily", l.daily_budget_micros)
            } else {
                ("monthly", l.monthly_budget_micros)
            };
            let amount = budget.map_or(String::new(), |b| format!("{} {currency}", money(b)));
            (
                "insufficient_quota",
                format!(
                    "tenant `{t}` has spent its {period} budget ({amount}) on `{}`; it renews in {wait}",
                    who.deployment
                ),
            )
        }
        "concurrency" => (
            "tenant_quota",
            format!(
                "tenant `{t}` already has {n} requests in flight across the fleet (maxConcurrentRequests {n})",
                n = tenant.max_concurrent_requests.unwrap_or(0)
            ),
        ),
        "requests" => (
            "rate_limit_exceeded",
            format!(
                "rate limit reached for tenant `{t}`: requestsPerMinute {}; try again in {wait}",
                l.requests_per_minute.unwrap_or(0)
            ),
        ),
        _ => (
            "rate_limit_exceeded",
            format!(
                "rate limit reached for tenant `{t}`: tokensPerMinute {}; try again in {wait}",
                l.tokens_per_minute.unwrap_or(0)
            ),
        ),
    };
    ApiError {
        code: Some(code.into()),
        ..ApiError::new(
            ApiErrorKind::RateLimited {
                retry_after_secs: secs,
            },
            message,
        )
    }
}

/// Millionths as a decimal amount ("25.5").
pub fn money(micros: u64) -> String {
    let frac = format!("{:06}", micros % MICROS);
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() {
        format!("{}", micros / MICROS)
    } else {
        format!("{}.{frac}", micros / MICROS)
    }
}
