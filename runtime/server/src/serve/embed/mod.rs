//! `serve` for an embedding model (docs/api.md, "Embeddings"): the same start-up phases, tenants,
//! admission, listeners and drain as a generation model, around an encoder instead of the decoder's
//! engine — `POST /v1/embeddings`, `/v1/models`, `/health`, `/ready` on the API port, `/metrics` and
//! `/health` on the admin port; chat and completions are a 400 naming the model's task.
//!
//! Invariants: nothing is served before the digests matched; tenant identity comes from the API key
//! only; every request is admitted through the same [`AdmissionGate`] bounds as generation (429 with
//! `Retry-After` when full, 503 while draining) and leaves it when answered or abandoned.

mod routes;
mod worker;

use super::config::RuntimeConfig;
use super::start;
use crate::metrics::RuntimeMetrics;
use crate::tenants::Auth;
use anyhow::{Context, bail};
use modelfleet_api::listener;
use modelfleet_engine::embed::{EmbedModel, Embedder};
use modelfleet_engine::kernels::cpu::CpuKernels;
use modelfleet_engine::sched::AdmissionGate;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
pub use worker::EmbedWorker;

/// The handlers' shared state.
pub struct EmbedState {
    /// The step loop.
    pub worker: EmbedWorker,
    /// What the handlers check inputs against (they tokenize on the blocking pool).
    pub model: ModelInfo,
    /// API keys → tenants.
    pub auth: Auth,
    /// The runtime's metrics.
    pub metrics: Arc<RuntimeMetrics>,
    /// The name clients use in `model`.
    pub served_name: String,
    /// Request bodies' bounds.
    pub body: super::state::BodyLimits,
    /// Longest a request may wait for its embeddings (the server's longest `timeout`, as for generation).
    pub max_timeout: Duration,
    /// Sequences one tenant may have waiting.
    pub tenant_queue_share: usize,
    /// Most prompt tokens the queue holds (a request over it alone is a 400, not a 429).
    pub max_queued_tokens: usize,
    /// Set on SIGTERM.
    pub draining: AtomicBool,
    /// When the server started (Unix seconds).
    pub created: u64,
}

/// What the handlers need to know about the model.
pub struct ModelInfo {
    /// Its tokenizer.
    pub tokenizer: Arc<modelfleet_engine::tokenizer::Tokenizer>,
    /// Elements per embedding.
    pub dimensions: usize,
    /// Dimensions a request may truncate to besides the full size.
    pub matryoshka: Option<Vec<usize>>,
    /// The longest input, tokens.
    pub max_input_tokens: usize,
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// Embeddings are unit length (truncated ones are normalised again).
    pub normalize: bool,
}

/// Loads the encoder on the kernels (on the blocking pool), and what the handlers need of it.
async fn load(cfg: &RuntimeConfig) -> anyhow::Result<(Embedder<CpuKernels>, ModelInfo)> {
    let (path, threads, bf16) = (cfg.model.path.clone(), cfg.engine.threads, cfg.bf16_dot);
    let embedder = tokio::task::spawn_blocking(move || {
        let model = EmbedModel::open(&path)?;
        let kernels = CpuKernels::new(threads).with_bf16_dot(bf16);
        Embedder::load(model, kernels)
    })
    .await?
    .with_context(|| format!("loading {}", cfg.model.path.display()))?;
    let c = &embedder.config;
    tracing::info!(
        model = %cfg.served_name,
        dimensions = embedder.dimensions(),
        pooling = c.pooling.name(),
        normalize = c.normalize,
        max_input_tokens = c.max_input_tokens,
        "embedding model loaded"
    );
    let info = ModelInfo {
        tokenizer: Arc::new(embedder.tokenizer.clone()),
        dimensions: embedder.dimensions(),
        matryoshka: c.encoder.matryoshka_dimensions.clone(),
        max_input_tokens: c.max_input_tokens,
        vocab_size: c.encoder.vocab_size,
        normalize: c.normalize,
    };
    Ok((embedder, info))
}

/// Runs an embedding model until SIGTERM (`verified`: its digests were checked already).
pub async fn serve(cfg: RuntimeConfig, verified: bool) -> anyhow::Result<()> {
    if cfg.draft.is_some() {
        bail!(
            "--draft-model: {} is an embedding model, which generates nothing to draft",
            cfg.model.path.display()
        );
    }
    if !verified {
        start::verify_digests(&cfg).await?;
    }
    let auth = start::authentication(&cfg)?;
    let metrics = Arc::new(RuntimeMetrics::default());
    let (embedder, info) = load(&cfg).await?;
    // A step holds at least 16 of the longest inputs: embedding traffic is many short inputs.
    let budget = cfg
        .scheduler
        .max_num_batched_tokens
        .max(16 * info.max_input_tokens);
    let gate = Arc::new(AdmissionGate::new(cfg.queue));
    let st = Arc::new(EmbedState {
        worker: EmbedWorker::start(embedder, gate, budget),
        model: info,
        auth,
        metrics,
        served_name: cfg.served_name.clone(),
        body: cfg.body,
        max_timeout: Duration::from_secs_f64(cfg.limits.max_timeout_secs),
        tenant_queue_share: cfg.tenant_queue_share,
        max_queued_tokens: cfg.queue.max_queued_tokens,
        draining: AtomicBool::new(false),
        created: start::unix_now(),
    });
    let listeners = start::listeners(&cfg).await?;
    tracing::info!(
        model = %st.served_name,
        "serving embeddings on http://{} (/metrics on http://{})",
        listeners.addr,
        listeners.second_addr
    );
    let serving = listeners.serve(
        (
            routes::api(st.clone(), cfg.body.max_bytes),
            cfg.listen.api.clone(),
        ),
        (routes::admin(st.clone()), cfg.listen.admin.clone()),
    );
    listener::shutdown_signal().await;
    serving.drain();
    tracing::info!("shutting down: refusing new requests, finishing queued ones");
    st.draining.store(true, Ordering::SeqCst);
    st.worker.gate.close();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < cfg.shutdown_grace
        && (st.worker.gate.queued().0 > 0 || st.worker.running.load(Ordering::Relaxed) > 0)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    serving.stop(Duration::from_secs(5)).await;
    tracing::info!("stopped");
    Ok(())
}
