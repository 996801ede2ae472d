//! Tenant limits over the whole fleet: requests and tokens per minute, requests in flight, and spend
//! budgets per UTC day and month, for the sum over every gateway replica (docs/gateway.md, "Tenant
//! limits").
//!
//! A request's way: [`Limiter::admit`] asks the store in one atomic step whether the tenant may start
//! one more request (in flight under `maxConcurrentRequests`, budgets not spent, a request and a token
//! left in its one-minute buckets) and, if so, takes a request, an estimate of the prompt's tokens and
//! a concurrency lease; the [`Lease`] then rides along with the response, counts completion tokens as
//! they stream (charged every [`STREAM_CHARGE_EVERY`] events), reads the runtime's exact usage at the
//! end (`x-modelfleet-usage` on a JSON answer, the `: modelfleet-usage` comment of a stream; see
//! [`meter`]), and when the response ends settles: the token estimate corrected, the cost priced from
//! the deployment's `spec.cost` added to the day's and month's spend, the usage row written, the lease
//! released.
//!
//! Invariants: the scope is (namespace, deployment, tenant) with the tenant from the key; a store that
//! cannot be reached within `--limits-store-timeout-ms` means `--limits-failure-mode` (open: admitted
//! without fleet limits; closed: 503 `limits_unavailable`) — never a hang; a tenant at its limit is
//! refused before anything is sent to a pod, so it costs other tenants nothing; settling happens once,
//! whatever way the response ends.

pub mod headers;
mod lease;
pub mod meter;
mod refusal;
pub mod scripts;
pub mod store;

use crate::metrics::Metrics;
use headers::RateHeaders;
use jiff::tz::TimeZone;
pub use lease::Lease;
use modelfleet_api::error::{ApiError, ApiErrorKind};
use modelfleet_api::limits::parse_micros;
use modelfleet_api::tenants::Tenant;
use modelfleet_crds::model_deployment::CostSpec;
use prometheus::{CounterVec, IntCounterVec, Opts};
use refusal::refused;
pub use refusal::{Refused, money};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use store::{AdmitArgs, Keys, Store};

/// Completion events streamed between two token charges.
pub const STREAM_CHARGE_EVERY: u64 = 16;
/// A concurrency lease lives this long unless renewed (a replica that dies frees its tenants' slots
/// within it).
pub const LEASE_LIFETIME: Duration = Duration::from_secs(30);
/// A live request renews its lease this often.
const LEASE_RENEW: Duration = Duration::from_secs(10);

/// What happens when the store cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailureMode {
    /// Admit, without fleet-wide limits, and count the failure (the default: availability first).
    Open,
    /// Refuse: 503 `limits_unavailable`.
    Closed,
}

/// A deployment's token prices, millionths of the currency per million tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prices {
    pub input: u64,
    pub cached_input: u64,
    pub output: u64,
    pub currency: String,
}

impl Prices {
    /// From `spec.cost` (no cost or no token prices: free). Cached input defaults to the input price.
    pub fn from_spec(cost: Option<&CostSpec>) -> Prices {
        let Some(c) = cost else {
            return Prices::default();
        };
        let p = |v: &Option<String>| v.as_deref().and_then(parse_micros);
        let input = p(&c.input_per_million_tokens).unwrap_or(0);
        Prices {
            input,
            cached_input: p(&c.cached_input_per_million_tokens).unwrap_or(input),
            output: p(&c.output_per_million_tokens).unwrap_or(0),
            currency: c.currency.clone(),
        }
    }

    /// The price of `u`, millionths of the currency, rounded up (a budget is never under-charged).
    pub fn cost(&self, u: &Usage) -> u64 {
        let uncached = u.prompt.saturating_sub(u.cached) as u128;
        let total = uncached * self.input as u128
            + u.cached.min(u.prompt) as u128 * self.cached_input as u128
            + u.completion as u128 * self.output as u128;
        total.div_ceil(1_000_000).min(u64::MAX as u128) as u64
    }
}

/// Tokens of one request, as the runtime counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
}
/// The metrics of limits and usage.
pub struct LimitMetrics {
    /// `modelfleet_gateway_limited_total{namespace,model_deployment,tenant,reason}`.
    pub limited: IntCounterVec,
    /// `modelfleet_gateway_tokens_total{namespace,model_deployment,tenant,model,kind}`.
    pub tokens: IntCounterVec,
    /// `modelfleet_gateway_cost_total{namespace,model_deployment,tenant,model,currency}`.
    pub cost: CounterVec,
    /// `modelfleet_gateway_limits_store_errors_total{operation}`.
    pub store_errors: IntCounterVec,
}

impl LimitMetrics {
    fn new(m: &Metrics) -> LimitMetrics {
        use modelfleet_api::metric_names as names;
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            m.register(Box::new(c.clone()));
            c
        };
        let cost = CounterVec::new(
            Opts::new(
                names::GATEWAY_COST,
                "What tenants were charged, priced from spec.cost, in the deployment's currency",
            ),
            &["namespace", "model_deployment", "tenant", "model", "currency"],
        )
        .expect("valid metric");
        m.register(Box::new(cost.clone()));
        LimitMetrics {
            limited: counter(
                names::GATEWAY_LIMITED,
                "Requests refused by a tenant limit: concurrency, requests, tokens, daily_budget, \
                 monthly_budget, or store_unavailable",
                &["namespace", "model_deployment", "tenant", "reason"],
            ),
            tokens: counter(
                names::GATEWAY_TOKENS,
                "Tokens served, as the runtime reports them: prompt (cached included), cached, completion",
                &["namespace", "model_deployment", "tenant", "model", "kind"],
            ),
            cost,
            store_errors: counter(
                names::GATEWAY_LIMITS_STORE_ERRORS,
                "Calls to the limits store that failed or timed out, by operation",
                &["operation"],
            ),
        }
    }
}

/// Who is limited: the deployment's labels, the tenant, and the model name used (base or adapter).
#[derive(Clone, Debug)]
pub struct Who {
    pub namespace: String,
    pub deployment: String,
    pub tenant: String,
    pub model: String,
}

impl Who {
    fn scope(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.deployment, self.tenant)
    }
}

/// The fleet's limiter.
pub struct Limiter {
    store: Store,
    failure: FailureMode,
    /// Whether the store is shared (else: this replica's memory).
    pub shared: bool,
    pub metrics: LimitMetrics,
    /// This replica's name in lease ids (its pod name and process id).
    replica: String,
}

/// Lease ids taken in this process.
static LEASES: AtomicU64 = AtomicU64::new(0);

/// UTC day and month of now, with the milliseconds left in each.
fn calendar() -> (String, String, u64, u64) {
    let now = jiff::Timestamp::now();
    let z = now.to_zoned(TimeZone::UTC);
    let d = z.date();
    let left = |end: jiff::civil::Date| {
        let end = end.to_zoned(TimeZone::UTC).map(|e| e.timestamp());
        end.map_or(86_400_000, |e| {
            (e.as_millisecond() - now.as_millisecond()).max(1) as u64
        })
    };
    let tomorrow = d.tomorrow().unwrap_or(d);
    let next_month = d
        .first_of_month()
        .checked_add(jiff::Span::new().months(1))
        .unwrap_or(d);
    (
        d.strftime("%Y-%m-%d").to_string(),
        d.strftime("%Y-%m").to_string(),
        left(tomorrow),
        left(next_month),
    )
}

/// The current UTC hour, `YYYY-MM-DDTHH` (a usage record's name).
pub fn hour_now() -> String {
    jiff::Timestamp::now()
        .to_zoned(TimeZone::UTC)
        .strftime("%Y-%m-%dT%H")
        .to_string()
}

impl Limiter {
    /// A limiter over `store`.
    pub fn new(store: Store, failure: FailureMode, metrics: &Metrics) -> Arc<Limiter> {
        let host = std::env::var("HOSTNAME").unwrap_or_default();
        let replica = format!("{host}-{}", std::process::id());
        Arc::new(Limiter {
            shared: matches!(store, Store::Redis(_)),
            store,
            failure,
            metrics: LimitMetrics::new(metrics),
            replica,
        })
    }

    /// The store (for the usage export).
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn store_failed(&self, operation: &str, why: &str) {
        self.metrics.store_errors.with_label_values(&[operation]).inc();
        tracing::warn!(operation, error = %why, "limits store unavailable");
    }

    /// Admits one request of `tenant` (its prompt estimated at `estimate` tokens), or refuses it.
    pub async fn admit(
        self: &Arc<Self>,
        who: Who,
        tenant: &Tenant,
        prices: Prices,
        estimate: u64,
    ) -> Result<Lease, Refused> {
        let l = &tenant.limits;
        let (day, month, day_left, month_left) = calendar();
        let keys = Keys::new(&who.scope(), &day, &month);
        let lease = tenant
            .max_concurrent_requests
            .map(|_| format!("{}-{}", self.replica, LEASES.fetch_add(1, Ordering::Relaxed)));
        let args = AdmitArgs {
            rpm: l.requests_per_minute.unwrap_or(0),
            tpm: l.tokens_per_minute.unwrap_or(0),
            max_concurrent: tenant.max_concurrent_requests.unwrap_or(0) as u64,
            day_budget: l.daily_budget_micros.unwrap_or(0),
            month_budget: l.monthly_budget_micros.unwrap_or(0),
            lease: lease.clone().unwrap_or_default(),
            lease_ms: LEASE_LIFETIME.as_millis() as u64,
            day_left_ms: day_left,
            month_left_ms: month_left,
            estimate,
        };
        let mut lease_out = Lease::new(self.clone(), keys, who.clone(), args.tpm, prices);
        let limited = l.any() || tenant.max_concurrent_requests.is_some();
        // A refused request has nothing to settle.
        let refuse = |mut lease: Lease, r: Refused| {
            lease.settled = true;
            r
        };
        if !limited {
            return Ok(lease_out);
        }
        let out = match self.store.admit(&lease_out.keys, &args).await {
            Ok(o) => o,
            Err(why) => {
                self.store_failed("admit", &why);
                return match self.failure {
                    FailureMode::Open => Ok(lease_out),
                    FailureMode::Closed => {
                        self.limited(&who, "store_unavailable");
                        let e = Refused::from(ApiError {
                            code: Some("limits_unavailable".into()),
                            ..ApiError::new(
                                ApiErrorKind::Unavailable,
                                "tenant limits cannot be checked right now (the limits store is \
                                 unreachable) and this gateway is configured to refuse rather than \
                                 serve unchecked (--limits-failure-mode closed)",
                            )
                        });
                        Err(refuse(lease_out, e))
                    }
                };
            }
        };
        lease_out.headers = RateHeaders {
            requests: l.requests_per_minute.map(|lim| (lim, out.requests_level)),
            tokens: l.tokens_per_minute.map(|lim| (lim, out.tokens_level)),
        };
        if let Some(reason) = &out.refusal {
            self.limited(&who, reason);
            let e = Refused {
                error: refused(&who, tenant, reason, out.wait_ms, &lease_out.prices.currency),
                headers: lease_out.headers.clone(),
            };
            return Err(refuse(lease_out, e));
        }
        lease_out.estimate = if args.tpm > 0 { estimate } else { 0 };
        if let Some(id) = lease {
            lease_out.renewer = Some(self.clone().renew_loop(lease_out.keys.clone(), id.clone()));
            lease_out.lease = Some(id);
        }
        Ok(lease_out)
    }

    fn limited(&self, who: &Who, reason: &str) {
        self.metrics
            .limited
            .with_label_values(&[&who.namespace, &who.deployment, &who.tenant, reason])
            .inc();
    }

    fn renew_loop(self: Arc<Self>, keys: Keys, id: String) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_RENEW).await;
                if let Err(why) = self
                    .store
                    .renew(&keys, &id, LEASE_LIFETIME.as_millis() as u64)
                    .await
                {
                    self.store_failed("renew", &why);
                }
            }
        })
    }
}

#[cfg(test)]
mod tests;
