//! What every handler shares: the engine handle, authentication, metrics, the served name and limits,
//! and whether the server is draining for shutdown.

use super::params::RequestLimits;
use crate::adapters::{ModelChoice, Registry};
use crate::api::error::{ApiError, ApiErrorKind};
use crate::metrics::{EngineGauges, RuntimeMetrics};
use crate::tenants::{Auth, AuthError, Tenant};
use axum::http::HeaderMap;
use modelfleet_engine::ModelDir;
use modelfleet_engine::sched::EngineHandle;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whose prefix cache a request may share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheScope {
    /// Each tenant has its own (the default).
    Tenant,
    /// Tenants of this deployment share one (must be chosen explicitly).
    Deployment,
}

/// Shared by every handler.
pub struct AppState {
    /// The engine.
    pub engine: Arc<EngineHandle>,
    /// API keys → tenants.
    pub auth: Auth,
    /// The runtime's metrics.
    pub metrics: Arc<RuntimeMetrics>,
    /// The name clients use in `model`.
    pub served_name: String,
    /// Per-request bounds.
    pub limits: RequestLimits,
    /// Prefix-cache sharing.
    pub scope: CacheScope,
    /// Set on SIGTERM: `/ready` is 503 and new requests are refused.
    pub draining: AtomicBool,
    /// When the server started (Unix seconds), for `/v1/models`.
    pub created: u64,
    /// LoRA adapters.
    pub adapters: Arc<Registry>,
    /// Set once the start-up adapters were loaded (or recorded as failed): `/ready` waits for it.
    pub adapters_ready: AtomicBool,
    /// The model thinks (`<think>…</think>` split out as `reasoning_content`; serve/reasoning.rs).
    pub thinking: bool,
    /// Structured output: the model's grammar compiler and cache, or why it has none.
    pub grammars: super::structured::GrammarSupport,
    /// `--enable-fault-injection`: the admin API may inject faults (tests, chaos drills).
    pub fault_injection: bool,
    /// The faults armed through the admin API.
    pub faults: super::faults::Faults,
    /// `--termination-log` (where a fatal reason goes; `None`: the default path if it exists).
    pub termination_log: Option<std::path::PathBuf>,
    /// How much body a request may send, and how fast.
    pub body: BodyLimits,
    /// Most sequences one tenant may have waiting (its share of the global queue).
    pub tenant_queue_share: Option<usize>,
    /// Permits for template rendering and tokenizing on the blocking pool.
    pub prompt_work: super::prompt::PromptWork,
    /// Speculative decoding counters.
    pub spec_metrics: crate::metrics::speculative::SpecMetrics,
    /// Where the step loop's time goes.
    pub step_metrics: crate::metrics::steps::StepMetrics,
}

/// The caller's tenant under `auth`, from `Authorization: Bearer`; never from the body (a 401 naming
/// what is wrong). Every server mode's one reading of a key.
pub fn authenticate(auth: &Auth, headers: &HeaderMap) -> Result<Arc<Tenant>, ApiError> {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    auth.authenticate(header).map_err(|e| {
        let message = match e {
            AuthError::Missing => "missing API key: send `Authorization: Bearer <key>`",
            AuthError::Invalid => "invalid API key",
        };
        ApiError::new(ApiErrorKind::Authentication, message)
    })
}

/// Request body bounds (read only after the caller's key was checked).
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    /// Largest body, bytes (413 beyond).
    pub max_bytes: usize,
    /// Time the client has to send it (408 beyond).
    pub read_timeout: std::time::Duration,
}

impl AppState {
    /// The model's tokenizer, template and config.
    pub fn model(&self) -> &Arc<ModelDir> {
        self.engine.model_dir()
    }

    /// The caller's tenant, from `Authorization: Bearer`; never from the body.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<Tenant>, ApiError> {
        authenticate(&self.auth, headers)
    }

    /// 503 while draining; 429 at once when the queue is already full (before parsing anything).
    pub fn check_open(&self, tenant: &Tenant) -> Result<(), ApiError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::new(
                ApiErrorKind::Unavailable,
                "the server is shutting down; retry on another replica",
            ));
        }
        self.engine.gate().precheck().map_err(|r| {
            self.metrics
                .requests_rejected
                .with_label_values(&[&self.served_name, &tenant.id, r.label()])
                .inc();
            super::generate::rejection_error(&r)
        })
    }

    /// `model` must name the base model or an adapter `tenant` may use (404 for anything else,
    /// including an adapter the tenant may not use: no existence oracle).
    pub fn check_model(&self, model: &str, tenant: &Tenant) -> Result<ModelChoice, ApiError> {
        self.adapters.resolve(model, &tenant.id)
    }

    /// The prefix-cache scope of a tenant's requests.
    pub fn cache_scope(&self, tenant: &Tenant) -> String {
        match self.scope {
            CacheScope::Tenant => format!("tenant:{}", tenant.id),
            CacheScope::Deployment => "deployment".into(),
        }
    }

    /// Copies the engine's latest stats into the gauges (at scrape time).
    pub fn refresh_gauges(&self) {
        let s = self.engine.stats();
        self.metrics.set_engine(&self.served_name, EngineGauges::from(&s));
        self.adapters.metrics().refresh(&s.adapters);
        self.spec_metrics.refresh(&s.spec);
        self.step_metrics.refresh(&(&s).into());
    }
}
