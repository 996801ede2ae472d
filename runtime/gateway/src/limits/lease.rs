//! One admitted request's share of its tenant's limits: it rides along with the response, meters it,
//! and settles once when the response ends (module header of `limits`).

use super::headers::RateHeaders;
use super::store::{Keys, UsageRow};
use super::{Limiter, Prices, STREAM_CHARGE_EVERY, Usage, Who, hour_now, meter};
use modelfleet_api::limits::MICROS;
use std::sync::Arc;

/// One admitted request's share of its tenant's limits, until its response ends.
pub struct Lease {
    pub(super) limiter: Arc<Limiter>,
    pub(super) keys: Keys,
    pub(super) who: Who,
    pub(super) tpm: u64,
    pub(super) prices: Prices,
    /// Prompt tokens charged at admission.
    pub(super) estimate: u64,
    pub(super) lease: Option<String>,
    pub(super) renewer: Option<tokio::task::JoinHandle<()>>,
    /// The `x-ratelimit-*` values at admission.
    pub headers: RateHeaders,
    /// What the response has shown of its usage.
    pub meter: meter::Meter,
    /// Completion events already charged.
    pub(super) charged_stream: u64,
    /// A pod's successful answer started (else nothing was served: no tokens are charged).
    pub(super) served: bool,
    pub(super) settled: bool,
}

impl Lease {
    /// A lease of `who` under `keys`, nothing taken yet.
    pub(super) fn new(limiter: Arc<Limiter>, keys: Keys, who: Who, tpm: u64, prices: Prices) -> Lease {
        Lease {
            limiter,
            keys,
            who,
            tpm,
            prices,
            estimate: 0,
            lease: None,
            renewer: None,
            headers: RateHeaders::default(),
            meter: meter::Meter::default(),
            charged_stream: 0,
            served: false,
            settled: false,
        }
    }

    /// A pod's successful answer starts, with its headers (a JSON answer's usage is in them).
    pub fn serving(&mut self, headers: &axum::http::HeaderMap) {
        self.served = true;
        if let Some(u) = headers.get(meter::USAGE_HEADER).and_then(|v| v.to_str().ok()) {
            self.meter.usage = meter::parse_usage(u);
        }
    }

    /// Feeds a streamed chunk to the meter; charges completion tokens every [`STREAM_CHARGE_EVERY`].
    pub fn streamed(&mut self, chunk: &[u8]) {
        self.meter.feed(chunk);
        let due = self.meter.events.saturating_sub(self.charged_stream);
        if self.tpm > 0 && due >= STREAM_CHARGE_EVERY {
            self.charged_stream += due;
            let (limiter, keys, tpm) = (self.limiter.clone(), self.keys.clone(), self.tpm);
            tokio::spawn(async move {
                if let Err(why) = limiter.store.charge(&keys, tpm, due as i64, 0, (0, 0)).await {
                    limiter.store_failed("charge", &why);
                }
            });
        }
    }

    /// The usage to settle: the runtime's report, else the estimates (a response cut short).
    fn usage(&self) -> Usage {
        if !self.served {
            return Usage::default();
        }
        self.meter.usage.unwrap_or(Usage {
            prompt: self.estimate,
            cached: 0,
            completion: self.meter.events,
        })
    }

    /// Settles once (also on drop): tokens corrected, cost, usage row, lease released.
    fn settle(&mut self) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        let u = self.usage();
        let cost = self.prices.cost(&u);
        self.count(&u, cost);
        let tokens = (u.prompt + u.completion) as i64 - (self.estimate + self.charged_stream) as i64;
        let tpm = self.tpm;
        let (limiter, keys, lease) = (self.limiter.clone(), self.keys.clone(), self.lease.take());
        let row = format!("{}/{}", self.who.scope(), self.who.model);
        let usage = self.served.then_some(UsageRow {
            requests: 1,
            prompt_tokens: u.prompt,
            cached_tokens: u.cached,
            completion_tokens: u.completion,
            cost_micros: cost,
        });
        let (day_ttl, month_ttl) = (2 * 86_400_000, 62 * 86_400_000);
        tokio::spawn(async move {
            let s = &limiter.store;
            if let Some(id) = lease
                && let Err(why) = s.release(&keys, &id).await
            {
                limiter.store_failed("release", &why);
            }
            if ((tpm > 0 && tokens != 0) || cost > 0)
                && let Err(why) = s.charge(&keys, tpm, tokens, cost, (day_ttl, month_ttl)).await
            {
                limiter.store_failed("charge", &why);
            }
            if let Some(usage) = usage
                && let Err(why) = s.record(&hour_now(), &row, &usage).await
            {
                limiter.store_failed("record", &why);
            }
        });
    }

    /// The usage counters of this replica.
    fn count(&self, u: &Usage, cost: u64) {
        let w = &self.who;
        let m = &self.limiter.metrics;
        let labels = |last| [&*w.namespace, &*w.deployment, &*w.tenant, &*w.model, last];
        for (kind, v) in [
            ("prompt", u.prompt),
            ("cached", u.cached),
            ("completion", u.completion),
        ] {
            if v > 0 {
                m.tokens.with_label_values(&labels(kind)).inc_by(v);
            }
        }
        if cost > 0 {
            m.cost
                .with_label_values(&labels(&self.prices.currency))
                .inc_by(cost as f64 / MICROS as f64);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.settle();
    }
}
