//! `status.capacity`: measured throughput per replica and cost per million output tokens for
//! ModelDeployments with `spec.cost`.
//!
//! Each reconcile pass of such a deployment calls [`Capacity::observe`]: at most every [`SAMPLE_INTERVAL`] it
//! reads one [`measure::Sample`] of the ready replicas' output-token counters and queue depths
//! ([`read`]: the pods' `/metrics` on the admin port, or Prometheus when `spec.autoscaling.metrics` says so), keeps the
//! samples of the last `spec.cost.windowSeconds` in the leader's memory, and computes the figures
//! ([`measure`], pure).
//!
//! Status hygiene (as the autoscaler's observed metrics): the figures are rounded, published once the
//! history spans [`MIN_SPAN`], and rewritten only when a figure changed and the last write is at least
//! [`WRITE_INTERVAL`] old — a steady fleet's status is written at most twice a minute, an idle one's
//! not at all once its window is full. A new leader starts its history afresh and keeps the previous
//! figures until it has its own. The same figures go to the operator's `/metrics`
//! (`modelfleet_capacity_*`) for the Grafana cost panel.

pub mod measure;
pub mod read;

use crate::labels::METRICS_PORT;
use crate::telemetry::Metrics;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use measure::{History, same_figures};
use modelfleet_crds::ModelDeployment;
use modelfleet_crds::model_deployment::{CapacityStatus, MetricsSource};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a deployment's replicas are sampled (and so how often its passes are requeued).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// Figures are rewritten in status at most this often.
pub const WRITE_INTERVAL: i64 = 30;
/// Least history before figures are published.
pub const MIN_SPAN: f64 = 30.0;
/// A deployment not sampled for this long is forgotten (it was deleted or lost its `spec.cost`).
const FORGET_AFTER: Duration = Duration::from_secs(900);

/// What the leader keeps per ModelDeployment.
#[derive(Debug)]
pub struct Memory {
    /// When a sample was last attempted.
    sampled: Option<Instant>,
    /// The window's samples.
    history: History,
}

/// The leader's capacity measurements: per ModelDeployment its samples, and what it reads them with.
pub struct Capacity {
    /// Per `namespace/name` with `spec.cost`: the samples of its window.
    memory: Mutex<HashMap<String, Memory>>,
    /// For pod scrapes and Prometheus queries.
    http: reqwest::Client,
    /// The operator's metrics (`modelfleet_capacity_*`).
    metrics: Arc<Metrics>,
}

impl Capacity {
    /// Nothing measured yet.
    pub fn new(http: reqwest::Client, metrics: Arc<Metrics>) -> Self {
        Capacity {
            memory: Mutex::new(HashMap::new()),
            http,
            metrics,
        }
    }

    /// `status.capacity` for this pass: `None` without `spec.cost`; otherwise the previous figures, or
    /// fresh ones when they are due (see the module header).
    pub async fn observe(&self, md: &ModelDeployment, pods: &[Pod]) -> Option<CapacityStatus> {
        observe(md, pods, self).await
    }
}

async fn observe(md: &ModelDeployment, pods: &[Pod], ctx: &Capacity) -> Option<CapacityStatus> {
    let ns = md.namespace().unwrap_or_default();
    let name = md.name_any();
    let key = format!("{ns}/{name}");
    forget_stale(ctx);
    // Capacity is priced per replica-hour; token prices alone are the gateway's business.
    let Some(cost) = md
        .spec
        .cost
        .as_ref()
        .filter(|c| c.price_per_replica_hour.is_some())
    else {
        ctx.memory.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        ctx.metrics.clear_capacity(&ns, &name);
        return None;
    };
    let previous = md.status.as_ref().and_then(|s| s.capacity.clone());
    {
        let mut mem = ctx.memory.lock().unwrap_or_else(|e| e.into_inner());
        let entry = mem.entry(key.clone()).or_insert_with(|| Memory {
            sampled: None,
            history: History::default(),
        });
        if entry.sampled.is_some_and(|t| t.elapsed() < SAMPLE_INTERVAL) {
            return previous;
        }
        entry.sampled = Some(Instant::now());
    }
    let sample = match sample(md, pods, ctx).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(%key, error = %e, "capacity sample skipped");
            return previous;
        }
    };
    let window = Duration::from_secs(cost.window_seconds.max(1) as u64);
    let measurement = {
        let mut mem = ctx.memory.lock().unwrap_or_else(|e| e.into_inner());
        let entry = mem.get_mut(&key)?;
        entry.history.push(sample, window);
        entry.history.measure()
    };
    let Some(m) = measurement.filter(|m| m.span >= MIN_SPAN) else {
        return previous;
    };
    let price: f64 = cost
        .price_per_replica_hour
        .as_deref()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    let now = Timestamp::now();
    let fresh = m.status(price, &cost.currency, now);
    let out = match previous {
        Some(p) => {
            let age = p
                .time
                .as_ref()
                .map_or(i64::MAX, |t| now.as_second() - t.0.as_second());
            if age >= WRITE_INTERVAL && !same_figures(&p, &fresh) {
                fresh
            } else {
                p
            }
        }
        None => fresh,
    };
    ctx.metrics.set_capacity(&ns, &name, &out);
    Some(out)
}

/// One sample of every ready replica of `md`.
async fn sample(md: &ModelDeployment, pods: &[Pod], ctx: &Capacity) -> Result<measure::Sample, String> {
    let ready: Vec<&Pod> = pods
        .iter()
        .filter(|p| modelfleet_crds::pods::is_ready(p))
        .collect();
    let metrics = md.spec.autoscaling.as_ref().map(|a| &a.metrics);
    match metrics {
        Some(m) if m.source == MetricsSource::Prometheus => {
            let prom = m.prometheus.as_ref().ok_or("metrics.prometheus is not set")?;
            let names: Vec<String> = ready.iter().map(|p| p.name_any()).collect();
            if names.is_empty() {
                return Ok(measure::Sample {
                    at: Instant::now(),
                    pods: Default::default(),
                });
            }
            read::query(&ctx.http, &prom.url, &md.namespace().unwrap_or_default(), &names).await
        }
        _ => {
            let targets: Vec<(String, String)> = ready
                .iter()
                .map(|p| {
                    let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
                    ip.map(|ip| (p.name_any(), ip))
                        .ok_or_else(|| format!("ready pod {} has no IP", p.name_any()))
                })
                .collect::<Result<_, _>>()?;
            read::scrape(&ctx.http, &targets, METRICS_PORT).await
        }
    }
}

/// Drops the memory (and metric series) of deployments not sampled for [`FORGET_AFTER`].
fn forget_stale(ctx: &Capacity) {
    let mut mem = ctx.memory.lock().unwrap_or_else(|e| e.into_inner());
    let stale: Vec<String> = mem
        .iter()
        .filter(|(_, m)| m.sampled.is_some_and(|t| t.elapsed() > FORGET_AFTER))
        .map(|(k, _)| k.clone())
        .collect();
    for key in stale {
        mem.remove(&key);
        if let Some((ns, name)) = key.split_once('/') {
            ctx.metrics.clear_capacity(ns, name);
        }
    }
}
