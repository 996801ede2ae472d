//! `serve`'s start-up, one function per phase, over a validated [`RuntimeConfig`]: verify the digests
//! (the model's and a draft model's, one path), read the tenants and the admin token, load the engine
//! on its step-loop thread (the KV pool sized from the memory budget, logged with its arithmetic), build
//! the handlers' shared state, and load the start-up adapters while the server already listens.
//!
//! Invariants: nothing is served before every digest matched (by default nothing is even parsed before;
//! with `--verify-beside-load`, for bytes a fetch container verified already, the check runs beside the
//! load and the listeners open only after both); a failure names the flag or file and becomes the
//! process's one-line termination message (`run`).

use super::config::{Artifact, RuntimeConfig};
use super::state::AppState;
use super::{generate, memory, structured};
use crate::adapters::startup::StartupPolicy;
use crate::tenants::{self, Auth};
use anyhow::{Context, bail};
use modelfleet_engine::kernels::cpu::CpuKernels;
use modelfleet_engine::sched::{EngineHandle, FinishHook};
use modelfleet_engine::{Engine, ModelDir};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Refuses to go on unless the model (and a draft model) have the digests they must have.
pub async fn verify_digests(cfg: &RuntimeConfig) -> anyhow::Result<()> {
    verify(&cfg.model).await?;
    if let Some((draft, _)) = &cfg.draft {
        verify(draft).await?;
    }
    Ok(())
}

async fn verify(a: &Artifact) -> anyhow::Result<()> {
    let Some(want) = a.digest.clone() else {
        return Ok(());
    };
    let path = a.path.clone();
    let got = tokio::task::spawn_blocking(move || crate::digest::digest_path(&path))
        .await?
        .with_context(|| format!("digest of {} {}", a.what, a.path.display()))?;
    if got != want {
        bail!(
            "digest mismatch: {} {} has {got}, expected {want}; refusing to serve",
            a.what,
            a.path.display()
        );
    }
    tracing::info!(model = %a.path.display(), digest = %got, "{} verified", a.what);
    Ok(())
}

/// The tenants table from `--tenants` (reloaded when the file changes), or single-tenant mode.
pub fn authentication(cfg: &RuntimeConfig) -> anyhow::Result<Auth> {
    Ok(match &cfg.tenants {
        Some(path) => {
            let table = tenants::load(path).with_context(|| format!("tenants file {}", path.display()))?;
            tenants::spawn_reloader(path.clone(), table.clone(), Duration::from_secs(2));
            Auth::Keys(table)
        }
        None => {
            tracing::warn!("no --tenants file: single-tenant mode, every request is tenant \"default\"");
            Auth::single_tenant()
        }
    })
}

/// The admin API's bearer token from `--admin-token-file` (`None`: the admin API refuses everything).
pub fn admin_token(cfg: &RuntimeConfig) -> anyhow::Result<Option<String>> {
    let Some(p) = &cfg.admin_token_file else {
        return Ok(None);
    };
    let token = std::fs::read_to_string(p).with_context(|| format!("admin token file {}", p.display()))?;
    Ok(Some(token.trim().to_owned()).filter(|t| !t.is_empty()))
}

/// Loads the model (and a draft model) on the step-loop thread, its KV pool sized from the memory
/// budget; every finished request is recorded in `metrics`.
pub async fn load_engine(
    cfg: &RuntimeConfig,
    metrics: &Arc<crate::metrics::RuntimeMetrics>,
) -> anyhow::Result<EngineHandle> {
    let (m, n) = (metrics.clone(), cfg.served_name.clone());
    let hook: FinishHook = Arc::new(move |tenant, f| generate::record(&m, &n, tenant, f));
    let (model, draft) = (cfg.model.path.clone(), cfg.draft.clone());
    let (engine_cfg, (pool_flags, pool_settings)) = (cfg.engine.clone(), cfg.pool.clone());
    let bf16_dot = cfg.bf16_dot;
    let load = move || {
        let md = ModelDir::open(&model)?;
        let draft = match draft {
            Some((d, k)) => Some((ModelDir::open(&d.path)?, k)),
            None => None,
        };
        // The pool's size, from the flags or the memory limit (one place: `kv::sizing`), logged with
        // its arithmetic; a draft model's weights and KV come out of the same budget.
        let pool = memory::plan(
            &md,
            draft.as_ref().map(|(d, k)| (d, *k)),
            &memory::pool_source(&pool_flags),
            &pool_settings,
        )?;
        tracing::info!("{pool}");
        let mut engine_cfg = engine_cfg;
        engine_cfg.num_kv_blocks = Some(pool.blocks);
        let kernels = CpuKernels::new(engine_cfg.threads).with_bf16_dot(bf16_dot);
        tracing::info!(
            kernels = %modelfleet_engine::kernels::Kernels::describe(&kernels),
            "compute kernels chosen"
        );
        let mut engine = Engine::load_with(md, kernels, &engine_cfg)?;
        if let Some((d, k)) = draft {
            // The draft cache mirrors the target's requests without prefix sharing, plus each
            // sequence's draft positions.
            let extra = memory::draft_extra_blocks(engine_cfg.max_num_seqs, k, engine_cfg.block_size);
            engine.attach_draft(d, engine.num_kv_blocks() + extra)?;
        }
        tracing::info!(
            "KV storage allocated: {} bytes ({} blocks)",
            engine.kv_cache_bytes(),
            engine.num_kv_blocks()
        );
        Ok(engine)
    };
    let (sched, queue) = (cfg.scheduler, cfg.queue);
    tokio::task::spawn_blocking(move || EngineHandle::start_with_hook(load, sched, queue, Some(hook)))
        .await?
        .with_context(|| format!("loading {}", cfg.model.path.display()))
}

/// The handlers' shared state, and the guard of a temporary adapter store (kept as long as the server).
pub async fn build_state(
    cfg: &RuntimeConfig,
    engine: EngineHandle,
    auth: Auth,
    metrics: Arc<crate::metrics::RuntimeMetrics>,
) -> anyhow::Result<(Arc<AppState>, Option<tempfile::TempDir>)> {
    let (registry, store_guard) = adapter_registry(cfg, &engine, &metrics)?;
    let name = cfg.served_name.clone();
    let st = Arc::new(AppState {
        grammars: structured::grammars(engine.model_dir()).await,
        thinking: super::reasoning::detect(engine.model_dir()),
        spec_metrics: crate::metrics::speculative::SpecMetrics::new(metrics.registry(), &name),
        step_metrics: crate::metrics::steps::StepMetrics::new(
            metrics.registry(),
            &name,
            cfg.scheduler.max_num_batched_tokens,
        ),
        adapters: Arc::new(registry),
        adapters_ready: Default::default(),
        engine: Arc::new(engine),
        auth,
        metrics,
        served_name: name,
        limits: cfg.limits,
        body: cfg.body,
        prompt_work: Default::default(),
        tenant_queue_share: Some(cfg.tenant_queue_share),
        scope: cfg.scope,
        fault_injection: cfg.fault_injection,
        faults: super::faults::Faults::new(cfg.fault_error_percent, cfg.fault_delay),
        termination_log: cfg.termination_log.clone(),
        draining: Default::default(),
        created: unix_now(),
    });
    Ok((st, store_guard))
}

/// The adapter registry over `--adapter-dir`, or a temporary directory that lives as long as the server.
fn adapter_registry(
    cfg: &RuntimeConfig,
    engine: &EngineHandle,
    metrics: &crate::metrics::RuntimeMetrics,
) -> anyhow::Result<(crate::adapters::Registry, Option<tempfile::TempDir>)> {
    let r = &cfg.registry;
    let (store, guard) = match &r.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("--adapter-dir {}", d.display()))?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("modelfleet-adapters-")
                .tempdir()
                .context("creating a temporary adapter directory")?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let lora_metrics = Arc::new(crate::adapters::LoraMetrics::new(
        metrics.registry(),
        &cfg.served_name,
        cfg.engine.max_loras,
    ));
    let registry = crate::adapters::Registry::new(
        crate::adapters::RegistryConfig {
            max_cpu_loras: r.max_cpu_loras,
            max_lora_rank: r.max_lora_rank,
            max_adapters: 1024,
            max_waiting: r.max_waiting,
            store,
            policy: r.policy.clone(),
            hf_endpoint: r.hf_endpoint.clone(),
            token: std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty()),
            fetch_limits: r.fetch_limits,
        },
        engine.model_dir().config.clone(),
        cfg.served_name.clone(),
        lora_metrics,
    );
    Ok((registry, guard))
}

/// `--adapters-file`, read before the server listens (a file that does not parse fails the start).
pub fn startup_adapters(
    cfg: &RuntimeConfig,
) -> anyhow::Result<Option<(crate::adapters::startup::AdaptersFile, StartupPolicy)>> {
    let Some((path, policy)) = &cfg.registry.startup else {
        return Ok(None);
    };
    let file = crate::adapters::startup::read(path)
        .with_context(|| format!("--adapters-file {}", path.display()))?;
    Ok(Some((file, *policy)))
}

/// Loads the start-up adapters while the server listens (so liveness holds); `/ready` waits for them,
/// up to the deadline. Without any, ready at once.
pub fn load_startup_adapters(
    st: &Arc<AppState>,
    startup: Option<(crate::adapters::startup::AdaptersFile, StartupPolicy)>,
) {
    let st = st.clone();
    tokio::spawn(async move {
        if let Some((file, policy)) = startup {
            crate::adapters::startup::load_all(st.adapters.clone(), file, policy).await;
        }
        st.adapters_ready.store(true, Ordering::SeqCst);
    });
}

/// The API and admin listeners `cfg` names, bound (a port in use fails the start, naming it).
pub async fn listeners(cfg: &RuntimeConfig) -> anyhow::Result<modelfleet_api::listener::Listeners> {
    modelfleet_api::listener::Listeners::bind(
        &cfg.listen.host,
        cfg.listen.port,
        cfg.listen.admin_port,
        "the admin port",
    )
    .await
    .map_err(Into::into)
}

/// Now, Unix seconds (`created` of `/v1/models`).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
