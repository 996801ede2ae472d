//! Where the counters live: the shared store (Redis or Valkey, `--limits-store redis://…`), which every
//! gateway replica reads and writes, or — with no store configured — this replica's memory (right for
//! one replica only; the chart always runs the store).
//!
//! Keys, all under `mf:` (docs/gateway.md, "Tenant limits"): per scope `{ns/deployment/tenant}` (a hash
//! tag, so a scope's keys share a Redis Cluster slot) the request and token buckets `:rq` and `:tk`, the
//! concurrency leases `:lease`, the spend `:spend:d:<YYYY-MM-DD>` and `:spend:m:<YYYY-MM>`; and per hour
//! the usage records `mf:usage:<YYYY-MM-DDTHH>`.
//!
//! Invariants: every call to the store is bounded by `--limits-store-timeout-ms` (an unreachable store
//! is an error at once, never a hang); the local twin keeps the scripts' semantics exactly.

use super::scripts;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One admission's inputs (0 = no such limit).
#[derive(Clone, Debug, Default)]
pub struct AdmitArgs {
    pub rpm: u64,
    pub tpm: u64,
    pub max_concurrent: u64,
    pub day_budget: u64,
    pub month_budget: u64,
    pub lease: String,
    pub lease_ms: u64,
    pub day_left_ms: u64,
    pub month_left_ms: u64,
    /// Prompt tokens charged at admission (corrected when the runtime reports the real count).
    pub estimate: u64,
}

/// What the store says.
#[derive(Clone, Debug, PartialEq)]
pub struct AdmitOut {
    /// Why not (`concurrency`, `requests`, `tokens`, `daily_budget`, `monthly_budget`), or None.
    pub refusal: Option<String>,
    /// When to try again, ms.
    pub wait_ms: u64,
    /// The request bucket's level after this admission.
    pub requests_level: f64,
    /// The token bucket's level after this admission.
    pub tokens_level: f64,
    /// Spent today and this month, millionths.
    pub day_spent: u64,
    pub month_spent: u64,
}

/// A scope's keys for one day and month.
#[derive(Clone, Debug)]
pub struct Keys {
    pub requests: String,
    pub tokens: String,
    pub leases: String,
    pub day: String,
    pub month: String,
}

impl Keys {
    /// The keys of `scope` (`ns/deployment/tenant`) on `day` (`YYYY-MM-DD`) and `month` (`YYYY-MM`).
    pub fn new(scope: &str, day: &str, month: &str) -> Keys {
        let base = format!("mf:{{{scope}}}");
        Keys {
            requests: format!("{base}:rq"),
            tokens: format!("{base}:tk"),
            leases: format!("{base}:lease"),
            day: format!("{base}:spend:d:{day}"),
            month: format!("{base}:spend:m:{month}"),
        }
    }
}

/// One usage row's increments for an hour.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageRow {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub cost_micros: u64,
}

impl UsageRow {
    /// The fields as stored, in the documented order.
    pub fn fields(&self) -> [(&'static str, u64); 5] {
        [
            ("requests", self.requests),
            ("prompt_tokens", self.prompt_tokens),
            ("cached_tokens", self.cached_tokens),
            ("completion_tokens", self.completion_tokens),
            ("cost_micros", self.cost_micros),
        ]
    }
}

/// How long usage records are kept in the store.
pub const USAGE_RETENTION: Duration = Duration::from_secs(35 * 86_400);

/// The counters' home.
pub enum Store {
    /// Shared by every replica.
    Redis(ConnectionManager),
    /// This replica's memory.
    Local(Mutex<Local>),
}

fn err(e: redis::RedisError) -> String {
    format!("the limits store: {e}")
}

impl Store {
    /// A store at `url` (connected lazily, reconnecting by itself), each call bounded by `timeout`.
    pub fn redis(url: &str, timeout: Duration) -> Result<Store, String> {
        let client = redis::Client::open(url).map_err(|e| format!("--limits-store {url:?}: {e}"))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(2));
        Ok(Store::Redis(
            ConnectionManager::new_lazy_with_config(client, config).map_err(err)?,
        ))
    }

    /// This replica's memory.
    pub fn local() -> Store {
        Store::Local(Mutex::default())
    }

    /// Admits (or refuses) one request.
    pub async fn admit(&self, k: &Keys, a: &AdmitArgs) -> Result<AdmitOut, String> {
        match self {
            Store::Local(m) => Ok(m.lock().unwrap().admit(k, a, Instant::now())),
            Store::Redis(c) => {
                let out: Vec<String> = redis::Script::new(scripts::ADMIT)
                    .key(&k.requests)
                    .key(&k.tokens)
                    .key(&k.leases)
                    .key(&k.day)
                    .key(&k.month)
                    .arg(a.rpm)
                    .arg(a.tpm)
                    .arg(a.max_concurrent)
                    .arg(a.day_budget)
                    .arg(a.month_budget)
                    .arg(&a.lease)
                    .arg(a.lease_ms)
                    .arg(a.day_left_ms)
                    .arg(a.month_left_ms)
                    .arg(a.estimate)
                    .invoke_async(&mut c.clone())
                    .await
                    .map_err(err)?;
                parse_admit(&out)
            }
        }
    }

    /// Charges `tokens` (negative: refunds an estimate) and `cost` millionths after the fact.
    pub async fn charge(
        &self,
        k: &Keys,
        tpm: u64,
        tokens: i64,
        cost: u64,
        ttl: (u64, u64),
    ) -> Result<(), String> {
        match self {
            Store::Local(m) => {
                m.lock().unwrap().charge(k, tpm, tokens, cost, Instant::now());
                Ok(())
            }
            Store::Redis(c) => {
                let _: String = redis::Script::new(scripts::CHARGE)
                    .key(&k.tokens)
                    .key(&k.day)
                    .key(&k.month)
                    .arg(tpm)
                    .arg(tokens)
                    .arg(cost)
                    .arg(ttl.0)
                    .arg(ttl.1)
                    .invoke_async(&mut c.clone())
                    .await
                    .map_err(err)?;
                Ok(())
            }
        }
    }

    /// Keeps a concurrency lease alive for another `lease_ms`.
    pub async fn renew(&self, k: &Keys, lease: &str, lease_ms: u64) -> Result<(), String> {
        match self {
            Store::Local(_) => Ok(()),
            Store::Redis(c) => {
                let at: u64 = redis::cmd("TIME")
                    .query_async::<(u64, u64)>(&mut c.clone())
                    .await
                    .map(|(s, us)| s * 1000 + us / 1000)
                    .map_err(err)?;
                redis::cmd("ZADD")
                    .arg(&k.leases)
                    .arg("XX")
                    .arg(at + lease_ms)
                    .arg(lease)
                    .query_async::<()>(&mut c.clone())
                    .await
                    .map_err(err)
            }
        }
    }

    /// Ends a concurrency lease.
    pub async fn release(&self, k: &Keys, lease: &str) -> Result<(), String> {
        match self {
            Store::Local(m) => {
                m.lock().unwrap().release(k, lease);
                Ok(())
            }
            Store::Redis(c) => redis::cmd("ZREM")
                .arg(&k.leases)
                .arg(lease)
                .query_async::<()>(&mut c.clone())
                .await
                .map_err(err),
        }
    }

    /// Adds a usage row to `hour`'s record (`mf:usage:<hour>`, field `<row>|<counter>`).
    pub async fn record(&self, hour: &str, row: &str, u: &UsageRow) -> Result<(), String> {
        let key = format!("mf:usage:{hour}");
        match self {
            Store::Local(m) => {
                let mut m = m.lock().unwrap();
                while m.usage.len() >= LOCAL_USAGE_HOURS && !m.usage.contains_key(&key) {
                    let oldest = m.usage.keys().min().cloned().expect("not empty");
                    m.usage.remove(&oldest);
                }
                let rec = m.usage.entry(key).or_default();
                for (f, v) in u.fields() {
                    *rec.entry(format!("{row}|{f}")).or_default() += v;
                }
                Ok(())
            }
            Store::Redis(c) => {
                let mut p = redis::pipe();
                for (f, v) in u.fields().into_iter().filter(|(_, v)| *v > 0) {
                    p.cmd("HINCRBY")
                        .arg(&key)
                        .arg(format!("{row}|{f}"))
                        .arg(v)
                        .ignore();
                }
                p.cmd("EXPIRE").arg(&key).arg(USAGE_RETENTION.as_secs()).ignore();
                p.query_async::<()>(&mut c.clone()).await.map_err(err)
            }
        }
    }

    /// `hour`'s usage record: field → value.
    pub async fn usage(&self, hour: &str) -> Result<HashMap<String, u64>, String> {
        let key = format!("mf:usage:{hour}");
        match self {
            Store::Local(m) => Ok(m.lock().unwrap().usage.get(&key).cloned().unwrap_or_default()),
            Store::Redis(c) => redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut c.clone())
                .await
                .map_err(err),
        }
    }
}

fn parse_admit(out: &[String]) -> Result<AdmitOut, String> {
    let bad = || format!("the limits store answered {out:?}");
    if out.len() != 6 {
        return Err(bad());
    }
    let f = |i: usize| out[i].parse::<f64>().map_err(|_| bad());
    Ok(AdmitOut {
        refusal: Some(out[0].clone()).filter(|r| !r.is_empty()),
        wait_ms: f(1)?.max(0.0) as u64,
        requests_level: f(2)?,
        tokens_level: f(3)?,
        day_spent: f(4)?.max(0.0) as u64,
        month_spent: f(5)?.max(0.0) as u64,
    })
}

/// Hours of usage records the local store keeps.
const LOCAL_USAGE_HOURS: usize = 48;

/// The date part of a spend key.
fn suffix(key: &str) -> &str {
    key.rsplit(':').next().unwrap_or_default()
}

/// A bucket in memory: level at a time.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    level: f64,
    at: Instant,
}

/// The local twin of the scripts (one replica).
#[derive(Default)]
pub struct Local {
    buckets: HashMap<String, Bucket>,
    leases: HashMap<String, HashMap<String, ()>>,
    spend: HashMap<String, u64>,
    usage: HashMap<String, HashMap<String, u64>>,
}

impl Local {
    fn level(&self, key: &str, limit: u64, now: Instant) -> f64 {
        let limit = limit as f64;
        match self.buckets.get(key) {
            None => limit,
            Some(b) => {
                let ms = now.saturating_duration_since(b.at).as_secs_f64() * 1000.0;
                (b.level + ms * limit / 60_000.0).min(limit)
            }
        }
    }

    fn admit(&mut self, k: &Keys, a: &AdmitArgs, now: Instant) -> AdmitOut {
        let mut rq = if a.rpm > 0 {
            self.level(&k.requests, a.rpm, now)
        } else {
            0.0
        };
        let mut tk = if a.tpm > 0 {
            self.level(&k.tokens, a.tpm, now)
        } else {
            0.0
        };
        let day = self.spend.get(&k.day).copied().unwrap_or(0);
        let month = self.spend.get(&k.month).copied().unwrap_or(0);
        let held = self.leases.get(&k.leases).map_or(0, |l| l.len() as u64);
        let wait = |level: f64, limit: u64| ((1.0 - level) * 60_000.0 / limit as f64).ceil() as u64;
        let refusal = if a.max_concurrent > 0 && held >= a.max_concurrent {
            Some(("concurrency", 1000))
        } else if a.month_budget > 0 && month >= a.month_budget {
            Some(("monthly_budget", a.month_left_ms))
        } else if a.day_budget > 0 && day >= a.day_budget {
            Some(("daily_budget", a.day_left_ms))
        } else if a.rpm > 0 && rq < 1.0 {
            Some(("requests", wait(rq, a.rpm)))
        } else if a.tpm > 0 && tk < 1.0 {
            Some(("tokens", wait(tk, a.tpm)))
        } else {
            None
        };
        if refusal.is_none() {
            if a.rpm > 0 {
                rq -= 1.0;
            }
            if a.tpm > 0 {
                tk -= a.estimate as f64;
            }
            if a.max_concurrent > 0 {
                self.leases
                    .entry(k.leases.clone())
                    .or_default()
                    .insert(a.lease.clone(), ());
            }
        }
        if a.rpm > 0 {
            self.buckets
                .insert(k.requests.clone(), Bucket { level: rq, at: now });
        }
        if a.tpm > 0 {
            self.buckets
                .insert(k.tokens.clone(), Bucket { level: tk, at: now });
        }
        AdmitOut {
            refusal: refusal.map(|(r, _)| r.to_string()),
            wait_ms: refusal.map_or(0, |(_, w)| w),
            requests_level: rq,
            tokens_level: tk,
            day_spent: day,
            month_spent: month,
        }
    }

    fn charge(&mut self, k: &Keys, tpm: u64, tokens: i64, cost: u64, now: Instant) {
        if tpm > 0 && tokens != 0 {
            let level = self.level(&k.tokens, tpm, now) - tokens as f64;
            self.buckets.insert(k.tokens.clone(), Bucket { level, at: now });
        }
        if cost > 0 {
            // Earlier days' and months' spend is of no further use here (bounded memory).
            let (day, month) = (suffix(&k.day), suffix(&k.month));
            self.spend
                .retain(|key, _| suffix(key) == day || suffix(key) == month);
            *self.spend.entry(k.day.clone()).or_default() += cost;
            *self.spend.entry(k.month.clone()).or_default() += cost;
        }
    }

    fn release(&mut self, k: &Keys, lease: &str) {
        if let Some(l) = self.leases.get_mut(&k.leases) {
            l.remove(lease);
            if l.is_empty() {
                self.leases.remove(&k.leases);
            }
        }
    }
}
