//! `modelfleet-runtime serve`: the OpenAI-compatible server around the engine (docs/design.md, "Runtime
//! HTTP API"), and its admin listener.
//!
//! [`serve`] runs in phases over one validated configuration ([`ServeArgs::validate`] →
//! [`RuntimeConfig`], config.rs): verify the digests (refuse to serve on a mismatch, with a termination
//! message), read the tenants and the admin token, load the engine on its step-loop thread, build the
//! handlers' state, listen on the API and admin ports (`runtime/api`'s listener pair), and drain on
//! SIGTERM (or SIGINT): `/ready` turns 503 and new requests get 503 at once; in-flight requests get
//! `--shutdown-grace-seconds` to finish, then whatever is left is cancelled and the process exits 0.
//! The phases are in start.rs; the flags in args.rs. An embedding model (an encoder: `embed/`) is
//! served by the same phases around its own step loop.

mod admin;
mod args;
mod body;
mod config;
mod embed;
mod faults;
mod generate;
mod inflight;
pub mod memory;
mod openai;
pub mod openapi;
pub mod params;
mod prompt;
mod reasoning;
mod routes;
pub mod speculative;
mod start;
pub mod state;
mod stream;
mod structured;
mod tools;
mod trace;
mod validate;

pub use args::{
    DEFAULT_BLOCK_SIZE, DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS,
    KvCacheDType, ServeArgs, Task,
};
pub use config::RuntimeConfig;

use anyhow::bail;
use modelfleet_api::listener;
use modelfleet_engine::sched::EngineHandle;
use state::AppState;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Runs the server until SIGTERM; start-up failures exit non-zero with a termination message.
pub fn run(args: ServeArgs) -> ExitCode {
    let telemetry = modelfleet_telemetry::init("modelfleet-runtime", &args.telemetry);
    if let Some(w) = &telemetry.warning {
        tracing::warn!("{w}");
    }
    record_fatal_panics(args.termination_log.clone());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(serve(args.clone()));
    // The async workers are done: the export thread gets a bounded time for the last spans.
    telemetry.shutdown(Duration::from_secs(3));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let line = format!("{e:#}");
            tracing::error!("{line}");
            crate::fetch_cmd::write_termination_log(args.termination_log.as_deref(), &line);
            ExitCode::FAILURE
        }
    }
}

/// Writes a panic's message to the termination log (`kubectl describe pod` shows it as the last
/// termination's message, and the operator's `RuntimeRestarts` condition quotes it), after the default
/// report on stderr. Panics that are caught and survived — a compile thread's — are not recorded, so
/// the log names what ended the process.
fn record_fatal_panics(termination_log: Option<PathBuf>) {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        if modelfleet_engine::constraint::workers::panics_are_caught_here() {
            return;
        }
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        let thread = std::thread::current();
        let line = format!(
            "panic in thread {}: {payload}{}",
            thread.name().unwrap_or("unnamed"),
            info.location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default()
        );
        crate::fetch_cmd::write_termination_log(termination_log.as_deref(), &line);
    }));
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let cfg = args.validate()?;
    if !cfg.verify_beside_load {
        start::verify_digests(&cfg).await?;
    }
    let encoder = modelfleet_engine::embed::is_encoder(&cfg.model.path);
    match (cfg.task, encoder) {
        (Some(args::Task::Embed), false) => bail!(
            "--task embed: {} is not an embedding model (embedding models are encoders: {})",
            cfg.model.path.display(),
            modelfleet_engine::embed::config::ENCODER_ARCHITECTURES.join(", ")
        ),
        (Some(args::Task::Generate), true) => bail!(
            "--task generate: {} is an embedding model (an encoder): it answers /v1/embeddings only",
            cfg.model.path.display()
        ),
        _ => {}
    }
    if encoder {
        let verified = !cfg.verify_beside_load;
        return embed::serve(cfg, verified).await;
    }
    let auth = start::authentication(&cfg)?;
    let admin_token = start::admin_token(&cfg)?;
    let metrics = Arc::new(crate::metrics::RuntimeMetrics::default());
    let engine = if cfg.verify_beside_load {
        // Both before anything listens; a mismatch wins over whatever the load made of those bytes.
        let (verified, engine) =
            tokio::join!(start::verify_digests(&cfg), start::load_engine(&cfg, &metrics));
        verified?;
        engine?
    } else {
        start::load_engine(&cfg, &metrics).await?
    };
    init_vllm_metrics(&metrics, &cfg.served_name, &engine, &args);
    let startup_adapters = start::startup_adapters(&cfg)?;
    let (st, _adapter_store) = start::build_state(&cfg, engine, auth, metrics).await?;
    let listeners = start::listeners(&cfg).await?;
    tracing::info!(
        model = %st.served_name,
        path = %st.engine.model_dir().path.display(),
        "serving on http://{} (admin and /metrics on http://{})",
        listeners.addr,
        listeners.second_addr
    );
    start::load_startup_adapters(&st, startup_adapters);
    let serving = listeners.serve(
        (
            routes::router(st.clone(), cfg.body.max_bytes),
            cfg.listen.api.clone(),
        ),
        (admin::router(st.clone(), admin_token), cfg.listen.admin.clone()),
    );
    tokio::select! {
        () = listener::shutdown_signal() => {}
        why = st.engine.failed() => {
            // The engine already ended every live request with an error; /health and /ready say 503.
            // Give those answers a moment to reach their clients, then exit non-zero so the kubelet
            // restarts the pod rather than keeping a dead engine in service.
            tracing::error!(reason = %why, "the engine failed; exiting so the pod restarts");
            st.draining.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(1)).await;
            bail!("{why}");
        }
    }
    serving.drain();
    drain(&st, cfg.shutdown_grace).await?;
    serving.stop(Duration::from_secs(5)).await;
    tracing::info!("stopped");
    Ok(())
}

/// SIGTERM: refuse new requests, give those in flight `grace` to finish, cancel the rest.
async fn drain(st: &Arc<AppState>, grace: Duration) -> anyhow::Result<()> {
    tracing::info!("shutting down: refusing new requests, draining in-flight ones");
    st.draining.store(true, Ordering::SeqCst);
    st.engine.gate().close();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < grace {
        let s = st.engine.stats();
        if s.running == 0 && s.waiting == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Whatever is left is cancelled (streams end with `finish_reason: cancelled`).
    let engine = st.engine.clone();
    tokio::task::spawn_blocking(move || engine.shutdown()).await?;
    Ok(())
}

/// Registers vLLM's metric aliases now that the pool and the context are known.
fn init_vllm_metrics(
    metrics: &crate::metrics::RuntimeMetrics,
    name: &str,
    engine: &EngineHandle,
    args: &ServeArgs,
) {
    let pool = engine.kv_pool();
    let cache = crate::metrics::vllm::CacheConfigInfo {
        block_size: args.block_size,
        num_gpu_blocks: pool.blocks,
        cache_dtype: args.kv_cache_dtype.name().into(),
        enable_prefix_caching: !args.no_enable_prefix_caching,
        kv_cache_memory_bytes: pool.bytes,
    };
    metrics.init_vllm(name, engine.max_model_len(), &cache);
}
