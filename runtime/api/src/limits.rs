//! A tenant's fleet-wide limits, as the tenants file declares them next to its keys:
//!
//! ```yaml
//! tenants:
//! - id: team-a
//!   apiKeys: ["sk-team-a-1"]
//!   requestsPerMinute: 600        # admitted requests, refilled continuously (a token bucket)
//!   tokensPerMinute: 200000       # prompt + completion tokens as the runtime counts them
//!   budget:                       # spend, priced from the ModelDeployment's spec.cost
//!     daily: "25.00"              # in spec.cost.currency; UTC days
//!     monthly: "400"              # UTC calendar months
//! ```
//!
//! The gateway enforces them for the sum over its replicas (docs/gateway.md, "Tenant limits"); the
//! runtime ignores them (it enforces `maxConcurrentRequests` and `maxQueuedTokens` per pod).
//!
//! Invariants: every limit is optional and, when present, positive; money is held in millionths of
//! the currency unit (exact decimal arithmetic, no float drift in budgets).

use serde::Deserialize;

/// Millionths of a currency unit per unit.
pub const MICROS: u64 = 1_000_000;

/// The request header by which the gateway asks a runtime pod to report a request's token usage, and
/// the response header of a JSON answer that carries the report.
pub const USAGE_HEADER: &str = "x-modelfleet-usage";
/// The name of the SSE comment that carries the report at the end of a stream (`: modelfleet-usage …`).
pub const USAGE_COMMENT: &str = "modelfleet-usage";

/// The report: `prompt=P cached=C completion=N` (prompt tokens include the cached ones).
pub fn usage_report(prompt: u64, cached: u64, completion: u64) -> String {
    format!("prompt={prompt} cached={cached} completion={completion}")
}

/// A tenant's limits (all optional).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Requests admitted per minute.
    pub requests_per_minute: Option<u64>,
    /// Prompt + completion tokens per minute.
    pub tokens_per_minute: Option<u64>,
    /// Spend per UTC day, in millionths of the currency unit.
    pub daily_budget_micros: Option<u64>,
    /// Spend per UTC calendar month, in millionths of the currency unit.
    pub monthly_budget_micros: Option<u64>,
}

impl Limits {
    /// Whether any of the fleet-wide limits is set.
    pub fn any(&self) -> bool {
        self.requests_per_minute.is_some()
            || self.tokens_per_minute.is_some()
            || self.daily_budget_micros.is_some()
            || self.monthly_budget_micros.is_some()
    }
}

/// An amount of money as written: a number or a decimal string.
#[derive(Deserialize, Clone, Debug)]
#[serde(untagged)]
pub(crate) enum Amount {
    Number(f64),
    Text(String),
}

/// `budget:` as written.
#[derive(Deserialize, Clone, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct BudgetEntry {
    #[serde(default)]
    daily: Option<Amount>,
    #[serde(default)]
    monthly: Option<Amount>,
}

/// A decimal string ("12", "0.35", "1000.000001") as millionths; None if it is not one, has more than
/// six decimals, or is too large.
pub fn parse_micros(s: &str) -> Option<u64> {
    let s = s.trim();
    let (whole, frac) = s.split_once('.').unwrap_or((s, "0"));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || frac.is_empty()
        || whole.len() > 12
        || frac.len() > 6
        || !digits(whole)
        || !digits(frac)
    {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let frac: u64 = format!("{frac:0<6}").parse().ok()?;
    whole.checked_mul(MICROS)?.checked_add(frac)
}

fn amount(tenant: &str, field: &str, a: &Amount) -> Result<u64, String> {
    let text = match a {
        Amount::Number(n) if n.is_finite() && *n >= 0.0 => format!("{n}"),
        Amount::Number(_) => String::new(),
        Amount::Text(t) => t.clone(),
    };
    match parse_micros(&text) {
        Some(0) | None => Err(format!(
            "tenant {tenant:?}: {field} must be a positive amount with at most 6 decimals (e.g. \"25.00\")"
        )),
        Some(m) => Ok(m),
    }
}

fn positive(tenant: &str, field: &str, v: Option<u64>) -> Result<Option<u64>, String> {
    match v {
        Some(0) => Err(format!("tenant {tenant:?}: {field} must be at least 1")),
        v => Ok(v),
    }
}

/// The limits of one tenants-file entry, validated.
pub(crate) fn from_entry(
    tenant: &str,
    requests_per_minute: Option<u64>,
    tokens_per_minute: Option<u64>,
    budget: Option<&BudgetEntry>,
) -> Result<Limits, String> {
    let budget = budget.cloned().unwrap_or_default();
    Ok(Limits {
        requests_per_minute: positive(tenant, "requestsPerMinute", requests_per_minute)?,
        tokens_per_minute: positive(tenant, "tokensPerMinute", tokens_per_minute)?,
        daily_budget_micros: budget
            .daily
            .as_ref()
            .map(|a| amount(tenant, "budget.daily", a))
            .transpose()?,
        monthly_budget_micros: budget
            .monthly
            .as_ref()
            .map(|a| amount(tenant, "budget.monthly", a))
            .transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_exact() {
        assert_eq!(parse_micros("12"), Some(12_000_000));
        assert_eq!(parse_micros("0.35"), Some(350_000));
        assert_eq!(parse_micros("1000.000001"), Some(1_000_000_001));
        for bad in ["", ".5", "1.", "1.0000001", "-1", "1e3", "abc", "1234567890123"] {
            assert_eq!(parse_micros(bad), None, "{bad}");
        }
    }

    #[test]
    fn amounts_and_rates_must_be_positive() {
        let b = |d: Amount| BudgetEntry {
            daily: Some(d),
            monthly: None,
        };
        let ok = from_entry("a", Some(60), None, Some(&b(Amount::Number(2.5)))).unwrap();
        assert_eq!(
            (
                ok.requests_per_minute,
                ok.daily_budget_micros,
                ok.monthly_budget_micros
            ),
            (Some(60), Some(2_500_000), None)
        );
        assert!(ok.any() && !Limits::default().any());
        let e = from_entry("a", Some(0), None, None).unwrap_err();
        assert!(e.contains("requestsPerMinute must be at least 1"), "{e}");
        let e = from_entry("a", None, None, Some(&b(Amount::Text("0".into())))).unwrap_err();
        assert!(e.contains("budget.daily must be a positive amount"), "{e}");
        let e = from_entry("a", None, None, Some(&b(Amount::Number(-1.0)))).unwrap_err();
        assert!(e.contains("budget.daily"), "{e}");
    }
}
