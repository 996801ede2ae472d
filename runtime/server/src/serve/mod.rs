//! `modelfleet-runtime serve`: the OpenAI-compatible server around the engine (docs/design.md, "Runtime
//! HTTP API"), and its admin listener.
//!
//! Start-up: verify the model's canonical digest against `--digest` (refuse to serve on a mismatch,
//! with a termination message), load the engine on its step-loop thread, then listen. SIGTERM (or
//! SIGINT): `/ready` turns 503 and new requests get 503 at once; in-flight requests get
//! `--shutdown-grace-seconds` to finish, then whatever is left is cancelled and the process exits 0.

mod admin;
mod body;
mod faults;
mod generate;
pub mod memory;
mod openai;
pub mod openapi;
pub mod params;
mod prompt;
mod routes;
pub mod speculative;
pub mod state;
mod structured;
mod tools;

use crate::tenants::{self, Auth};
use anyhow::{Context, bail};
use modelfleet_api::listener::{self, Limits as ListenerLimits};
use modelfleet_engine::kernels::KvDType;
use modelfleet_engine::kernels::cpu::CpuKernels;
use modelfleet_engine::sched::{EngineHandle, FinishHook, QueueLimits, SchedulerConfig};
use modelfleet_engine::{Engine, EngineConfig, ModelDir};
use params::RequestLimits;
use state::{AppState, CacheScope};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// `--max-num-seqs` default (also `plan`'s, whose arithmetic must match).
pub const DEFAULT_MAX_NUM_SEQS: usize = 64;
/// `--max-num-batched-tokens` default.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 512;
/// `--block-size` default.
pub const DEFAULT_BLOCK_SIZE: usize = 16;
/// `--max-lora-rank` default.
pub const DEFAULT_MAX_LORA_RANK: usize = 16;

/// `--kv-cache-dtype` (vLLM's flag; `auto` is the engine's compute type, f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheDType {
    /// The compute type (f32).
    Auto,
    /// 32-bit floats.
    #[value(alias = "f32")]
    Float32,
    /// IEEE half precision.
    #[value(alias = "f16", alias = "half")]
    Float16,
}

impl KvCacheDType {
    /// The engine's element type.
    pub fn kv_dtype(self) -> KvDType {
        match self {
            KvCacheDType::Auto | KvCacheDType::Float32 => KvDType::F32,
            KvCacheDType::Float16 => KvDType::F16,
        }
    }

    /// The flag's value, as `vllm:cache_config_info` reports it.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDType::Auto => "auto",
            KvCacheDType::Float32 => "float32",
            KvCacheDType::Float16 => "float16",
        }
    }
}

/// `serve` flags; each can also come from `MODELFLEET_<FLAG_IN_CAPS>`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// A Hugging Face model directory, a `.gguf` file, or a directory holding exactly one.
    #[arg(long, env = "MODELFLEET_MODEL")]
    pub model: PathBuf,
    /// Refuse to serve unless the model's canonical digest is this (`sha256:…`).
    #[arg(long, env = "MODELFLEET_DIGEST")]
    pub digest: Option<String>,
    /// The name clients put in `model` (default: the model path's last component).
    #[arg(long, env = "MODELFLEET_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Address to bind (default: `$POD_IP` if set, else 127.0.0.1).
    #[arg(long, env = "MODELFLEET_HOST")]
    pub host: Option<String>,
    /// API port.
    #[arg(long, env = "MODELFLEET_PORT", default_value_t = 8000)]
    pub port: u16,
    /// Admin API port (adapters), with its own token.
    #[arg(long, env = "MODELFLEET_ADMIN_PORT", default_value_t = 8001)]
    pub admin_port: u16,
    /// File holding the admin bearer token; without it the admin API refuses everything.
    #[arg(long, env = "MODELFLEET_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Tenants file (API keys → tenants); without it the server is single-tenant ("default").
    #[arg(long, env = "MODELFLEET_TENANTS")]
    pub tenants: Option<PathBuf>,
    /// Compute threads (0 = one per core).
    #[arg(long, env = "MODELFLEET_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Context limit (default: the model's).
    #[arg(long, env = "MODELFLEET_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Most sequences in one batch.
    #[arg(long, env = "MODELFLEET_MAX_NUM_SEQS", default_value_t = DEFAULT_MAX_NUM_SEQS)]
    pub max_num_seqs: usize,
    /// Most tokens computed in one step.
    #[arg(
        long,
        env = "MODELFLEET_MAX_NUM_BATCHED_TOKENS",
        default_value_t = DEFAULT_MAX_NUM_BATCHED_TOKENS
    )]
    pub max_num_batched_tokens: usize,
    /// Most requests waiting; more get 429.
    #[arg(long, env = "MODELFLEET_MAX_NUM_QUEUED_REQS", default_value_t = 256)]
    pub max_num_queued_reqs: usize,
    /// Most prompt tokens waiting; more get 429.
    #[arg(long, env = "MODELFLEET_MAX_NUM_QUEUED_TOKENS", default_value_t = 262_144)]
    pub max_num_queued_tokens: usize,
    /// Tokens per KV block.
    #[arg(long, env = "MODELFLEET_BLOCK_SIZE", default_value_t = DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
    /// Element type of the KV cache: `auto` and `float32` keep exactly what the model computed;
    /// `float16` (llama.cpp's default cache type) halves the cache's memory and the bytes attention
    /// reads, rounding each cached key and value to f16.
    #[arg(long, env = "MODELFLEET_KV_CACHE_DTYPE", value_enum, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDType,
    /// KV blocks, exactly (overrides `--kv-cache-memory-bytes` and the memory limit; may be smaller
    /// than a context, and requests that do not fit get 413).
    #[arg(long, env = "MODELFLEET_NUM_KV_BLOCKS")]
    pub num_kv_blocks: Option<usize>,
    /// Bytes of KV-cache storage (vLLM's flag; `8Gi`, `8G`, `8g` accepted); overrides the memory limit.
    #[arg(long, env = "MODELFLEET_KV_CACHE_MEMORY_BYTES", value_parser = memory::parse_bytes)]
    pub kv_cache_memory_bytes: Option<u64>,
    /// The process's memory limit: the KV pool gets what is left after the weights, the step
    /// workspace and a headroom (docs/capacity.md). In a pod the operator sets it from the downward
    /// API's `limits.memory`; without it the cgroup's limit applies, and with neither a default pool
    /// (`--max-num-seqs` sequences of up to 2,048 tokens, at least one context).
    #[arg(long, env = "MODELFLEET_MEMORY_LIMIT_BYTES", value_parser = memory::parse_bytes)]
    pub memory_limit_bytes: Option<u64>,
    /// Reuse cached prompt prefixes.
    #[arg(
        long,
        env = "MODELFLEET_ENABLE_PREFIX_CACHING",
        overrides_with = "no_enable_prefix_caching"
    )]
    pub enable_prefix_caching: bool,
    /// Do not reuse cached prompt prefixes.
    #[arg(long, env = "MODELFLEET_NO_ENABLE_PREFIX_CACHING")]
    pub no_enable_prefix_caching: bool,
    /// Who may share cached prefixes: each tenant alone, or the whole deployment.
    #[arg(
        long,
        env = "MODELFLEET_PREFIX_CACHE_SCOPE",
        value_enum,
        default_value = "tenant"
    )]
    pub prefix_cache_scope: CacheScope,
    /// Most distinct LoRA adapters in one batch; requests for another adapter wait for a slot.
    #[arg(long, env = "MODELFLEET_MAX_LORAS", default_value_t = 4)]
    pub max_loras: usize,
    /// Most LoRA adapters kept in memory (default: `--max-loras`); others reload from disk on demand.
    #[arg(long, env = "MODELFLEET_MAX_CPU_LORAS")]
    pub max_cpu_loras: Option<usize>,
    /// Largest LoRA rank accepted.
    #[arg(long, env = "MODELFLEET_MAX_LORA_RANK", default_value_t = DEFAULT_MAX_LORA_RANK)]
    pub max_lora_rank: usize,
    /// Adapters to load before `/ready` turns 200 (JSON `{"adapters": [{name, uri, digest, tenants}]}`).
    #[arg(long, env = "MODELFLEET_ADAPTERS_FILE")]
    pub adapters_file: Option<PathBuf>,
    /// Where fetched adapters are kept, by digest (default: a temporary directory removed at exit).
    #[arg(long, env = "MODELFLEET_ADAPTER_DIR")]
    pub adapter_dir: Option<PathBuf>,
    /// URI schemes adapters may come from (of file, http, https, hf).
    #[arg(
        long,
        env = "MODELFLEET_ADAPTER_URI_SCHEMES",
        value_delimiter = ',',
        default_value = "file,https,hf"
    )]
    pub adapter_uri_schemes: Vec<String>,
    /// Directories `file://` adapters must lie under (none: `file://` adapters are refused).
    #[arg(long, env = "MODELFLEET_ADAPTER_FILE_ROOTS", value_delimiter = ',')]
    pub adapter_file_roots: Vec<PathBuf>,
    /// Hugging Face Hub endpoint for `hf://` adapters; the only origin `HF_TOKEN` is ever sent to.
    #[arg(long, env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
    pub hf_endpoint: String,
    /// Most bytes one adapter's download may have (default: the free space of `--adapter-dir`; the
    /// operator passes the adapter store volume's `sizeLimit`).
    #[arg(long, env = "MODELFLEET_MAX_ADAPTER_BYTES")]
    pub max_adapter_bytes: Option<u64>,
    /// Longest one adapter's download and verification may take, seconds.
    #[arg(long, env = "MODELFLEET_ADAPTER_FETCH_TIMEOUT_SECONDS", default_value_t = 100)]
    pub adapter_fetch_timeout_seconds: u64,
    /// Start-up adapters (`--adapters-file`) loading at once.
    #[arg(long, env = "MODELFLEET_STARTUP_ADAPTER_CONCURRENCY", default_value_t = 4)]
    pub startup_adapter_concurrency: usize,
    /// Longest `/ready` waits for the start-up adapters, seconds; one not loaded by then is listed as
    /// failed and keeps loading in the background.
    #[arg(
        long,
        env = "MODELFLEET_STARTUP_ADAPTER_DEADLINE_SECONDS",
        default_value_t = 120
    )]
    pub startup_adapter_deadline_seconds: u64,
    /// Longest request `timeout`, seconds (also the default).
    #[arg(long, env = "MODELFLEET_MAX_REQUEST_TIMEOUT", default_value_t = 600.0)]
    pub max_request_timeout: f64,
    /// Largest request body, bytes.
    #[arg(long, env = "MODELFLEET_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Seconds a client has to send a request body (after its key was checked).
    #[arg(long, env = "MODELFLEET_BODY_READ_TIMEOUT", default_value_t = 30.0)]
    pub body_read_timeout: f64,
    /// Seconds a client has to send a request's headers; slower connections are closed.
    #[arg(long, env = "MODELFLEET_HEADER_READ_TIMEOUT", default_value_t = 10.0)]
    pub header_read_timeout: f64,
    /// Most connections open at once on the API port; more are closed as they arrive.
    #[arg(long, env = "MODELFLEET_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// Most engine sequences one request fans out to (prompts × `n`).
    #[arg(long, env = "MODELFLEET_MAX_SEQUENCES_PER_REQUEST", default_value_t = 16)]
    pub max_sequences_per_request: usize,
    /// Most sequences one tenant may have waiting (default: half of `--max-num-queued-reqs` with a
    /// tenants file, so no tenant fills the queue for the others; all of it without one).
    #[arg(long, env = "MODELFLEET_MAX_NUM_QUEUED_REQS_PER_TENANT")]
    pub max_num_queued_reqs_per_tenant: Option<usize>,
    /// Longest `cache_salt`, bytes.
    #[arg(long, env = "MODELFLEET_MAX_CACHE_SALT_BYTES", default_value_t = 256)]
    pub max_cache_salt_bytes: usize,
    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, env = "MODELFLEET_SHUTDOWN_GRACE_SECONDS", default_value_t = 30)]
    pub shutdown_grace_seconds: u64,
    /// Lets the admin API inject faults (`POST /v1/faults/engine-panic`): for tests and chaos drills.
    #[arg(long, env = "MODELFLEET_ENABLE_FAULT_INJECTION", hide = true)]
    pub enable_fault_injection: bool,
    /// Speculative decoding, as vLLM's JSON: `{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_max": 4}` or `{"model": PATH, "num_speculative_tokens": 3}` (see docs/operations.md).
    #[arg(long, env = "MODELFLEET_SPECULATIVE_CONFIG")]
    pub speculative_config: Option<String>,
    /// Where a start-up failure's one-line reason goes (written only if the file exists, as in a pod,
    /// unless the flag is given explicitly).
    #[arg(long, env = "MODELFLEET_TERMINATION_LOG")]
    pub termination_log: Option<PathBuf>,
}

/// Runs the server until SIGTERM; start-up failures exit non-zero with a termination message.
pub fn run(args: ServeArgs) -> ExitCode {
    crate::logging::init();
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
    match runtime.block_on(serve(args.clone())) {
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

fn served_name(args: &ServeArgs) -> String {
    args.served_model_name.clone().unwrap_or_else(|| {
        args.model
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| "model".into())
    })
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if let Some(want) = &args.digest {
        let path = args.model.clone();
        let got = tokio::task::spawn_blocking(move || crate::digest::digest_path(&path))
            .await?
            .with_context(|| format!("digest of {}", args.model.display()))?;
        if &got != want {
            bail!(
                "digest mismatch: {} has {got}, expected {want}; refusing to serve",
                args.model.display()
            );
        }
        tracing::info!(model = %args.model.display(), digest = %got, "model verified");
    }
    let auth = match &args.tenants {
        Some(path) => {
            let table = tenants::load(path).with_context(|| format!("tenants file {}", path.display()))?;
            tenants::spawn_reloader(path.clone(), table.clone(), Duration::from_secs(2));
            Auth::Keys(table)
        }
        None => {
            tracing::warn!("no --tenants file: single-tenant mode, every request is tenant \"default\"");
            Auth::single_tenant()
        }
    };
    let admin_token = match &args.admin_token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("admin token file {}", p.display()))?
                .trim()
                .to_owned(),
        )
        .filter(|t| !t.is_empty()),
        None => None,
    };
    let (threads, block_size, max_num_seqs) = (args.threads, args.block_size, args.max_num_seqs);
    let max_model_len = args.max_model_len;
    let max_loras = args.max_loras;
    let kv_cache_dtype = args.kv_cache_dtype.kv_dtype();
    let max_cpu_loras = args.max_cpu_loras.unwrap_or(max_loras);
    if max_loras == 0 || max_cpu_loras < max_loras || !(1..=512).contains(&args.max_lora_rank) {
        bail!(
            "--max-loras must be >= 1 (got {max_loras}), --max-cpu-loras >= --max-loras (got {max_cpu_loras}), \
             --max-lora-rank in [1, 512] (got {})",
            args.max_lora_rank
        );
    }
    for (flag, secs) in [
        ("--body-read-timeout", args.body_read_timeout),
        ("--header-read-timeout", args.header_read_timeout),
    ] {
        if !(secs.is_finite() && secs > 0.0 && secs <= 3600.0) {
            bail!("{flag} must be in (0, 3600] seconds, got {secs}");
        }
    }
    if args.max_connections == 0 || args.max_sequences_per_request == 0 {
        bail!("--max-connections and --max-sequences-per-request must be >= 1");
    }
    if let Some(bad) = args
        .adapter_uri_schemes
        .iter()
        .find(|s| !["file", "http", "https", "hf"].contains(&s.as_str()))
    {
        bail!("--adapter-uri-schemes: unknown scheme {bad:?} (use file, http, https, hf)");
    }
    let spec = args
        .speculative_config
        .as_deref()
        .map(speculative::parse)
        .transpose()?;
    if let Some(s) = &spec
        && let (Some(path), Some(want)) = (&s.draft, &s.draft_digest)
    {
        let p = path.clone();
        let got = tokio::task::spawn_blocking(move || crate::digest::digest_path(&p))
            .await?
            .with_context(|| format!("digest of the draft model {}", path.display()))?;
        if &got != want {
            bail!(
                "draft model digest mismatch: {} has {got}, expected {want}",
                path.display()
            );
        }
    }
    let sched = SchedulerConfig {
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        enable_prefix_caching: !args.no_enable_prefix_caching,
        max_loras,
        speculative: spec.as_ref().map(|s| s.config),
    };
    let draft = spec.and_then(|s| s.draft.map(|path| (path, s.config.num_speculative_tokens)));
    let queue = QueueLimits {
        max_queued_requests: args.max_num_queued_reqs,
        max_queued_tokens: args.max_num_queued_tokens,
    };
    let path = args.model.clone();
    let metrics = Arc::new(crate::metrics::RuntimeMetrics::default());
    let name = served_name(&args);
    let (m, n) = (metrics.clone(), name.clone());
    let hook: FinishHook = Arc::new(move |tenant, f| generate::record(&m, &n, tenant, f));
    let pool_flags = memory::PoolFlags {
        num_kv_blocks: args.num_kv_blocks,
        kv_cache_memory_bytes: args.kv_cache_memory_bytes,
        memory_limit_bytes: args.memory_limit_bytes,
    };
    let pool_settings = memory::PoolSettings {
        block_size,
        kv_elem_bytes: kv_cache_dtype.bytes(),
        max_model_len,
        max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_lora_rank: args.max_lora_rank,
    };
    let load = move || {
        let md = ModelDir::open(&path)?;
        let draft = match draft {
            Some((path, k)) => Some((ModelDir::open(&path)?, k)),
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
        eprintln!("serve: {pool}");
        let cfg = EngineConfig {
            threads,
            block_size,
            num_kv_blocks: Some(pool.blocks),
            max_model_len,
            max_num_seqs,
            max_loras,
            kv_cache_dtype,
        };
        let kernels = CpuKernels::new(threads);
        tracing::info!(
            kernels = %modelfleet_engine::kernels::Kernels::describe(&kernels),
            "compute kernels chosen"
        );
        let mut engine = Engine::load_with(md, kernels, &cfg)?;
        if let Some((d, k)) = draft {
            // The draft cache mirrors the target's requests without prefix sharing, plus each
            // sequence's draft positions.
            let blocks = engine.num_kv_blocks() + memory::draft_extra_blocks(max_num_seqs, k, block_size);
            engine.attach_draft(d, blocks)?;
        }
        eprintln!(
            "serve: KV storage allocated: {} bytes ({} blocks)",
            engine.kv_cache_bytes(),
            engine.num_kv_blocks()
        );
        Ok(engine)
    };
    let engine =
        tokio::task::spawn_blocking(move || EngineHandle::start_with_hook(load, sched, queue, Some(hook)))
            .await?
            .with_context(|| format!("loading {}", args.model.display()))?;
    init_vllm_metrics(&metrics, &name, &engine, &args);
    let startup_adapters = match &args.adapters_file {
        Some(p) => Some(
            crate::adapters::startup::read(p).with_context(|| format!("--adapters-file {}", p.display()))?,
        ),
        None => None,
    };
    // The store: the given directory, or a temporary one that lives as long as the server.
    let (store, _store_guard) = match &args.adapter_dir {
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
        &name,
        max_loras,
    ));
    let registry = crate::adapters::Registry::new(
        crate::adapters::RegistryConfig {
            max_cpu_loras,
            max_lora_rank: args.max_lora_rank,
            max_adapters: 1024,
            max_waiting: args.max_num_queued_reqs,
            store,
            policy: crate::adapters::UriPolicy {
                schemes: args.adapter_uri_schemes.clone(),
                file_roots: args.adapter_file_roots.clone(),
            },
            hf_endpoint: args.hf_endpoint.clone(),
            token: std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty()),
            fetch_limits: crate::fetch::Limits {
                max_bytes: args.max_adapter_bytes,
                timeout: Some(Duration::from_secs(args.adapter_fetch_timeout_seconds.max(1))),
            },
        },
        engine.model_dir().config.clone(),
        name.clone(),
        lora_metrics,
    );
    let grammars = structured::grammars(engine.model_dir()).await;
    let spec_metrics = crate::spec_metrics::SpecMetrics::new(metrics.registry(), &name);
    let step_metrics = crate::metrics::steps::StepMetrics::new(metrics.registry(), &name);
    let st = Arc::new(AppState {
        grammars,
        spec_metrics,
        step_metrics,
        adapters: Arc::new(registry),
        adapters_ready: Default::default(),
        engine: Arc::new(engine),
        auth,
        metrics,
        served_name: name,
        limits: RequestLimits {
            max_timeout_secs: args.max_request_timeout,
            max_sequences: args.max_sequences_per_request,
            max_cache_salt_bytes: args.max_cache_salt_bytes,
            ..RequestLimits::default()
        },
        body: state::BodyLimits {
            max_bytes: args.max_body_bytes,
            read_timeout: Duration::from_secs_f64(args.body_read_timeout),
        },
        prompt_work: Default::default(),
        tenant_queue_share: Some(
            args.max_num_queued_reqs_per_tenant
                .unwrap_or(if args.tenants.is_some() {
                    (args.max_num_queued_reqs / 2).max(args.max_sequences_per_request)
                } else {
                    args.max_num_queued_reqs
                }),
        ),
        scope: args.prefix_cache_scope,
        fault_injection: args.enable_fault_injection,
        faults: Default::default(),
        termination_log: args.termination_log.clone(),
        draining: Default::default(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let host = args
        .host
        .clone()
        .or_else(|| std::env::var("POD_IP").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "127.0.0.1".into());
    let addr: SocketAddr = format!("{host}:{}", args.port)
        .parse()
        .with_context(|| format!("--host {host}"))?;
    let admin_addr = SocketAddr::new(addr.ip(), args.admin_port);
    let api = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let admin = tokio::net::TcpListener::bind(admin_addr)
        .await
        .with_context(|| format!("binding the admin port {admin_addr}"))?;
    tracing::info!(
        model = %st.served_name,
        path = %st.engine.model_dir().path.display(),
        "serving on http://{addr} (admin and /metrics on http://{admin_addr})"
    );
    // Start-up adapters load while the server listens (so liveness holds); `/ready` waits for them, up
    // to the deadline.
    {
        let st = st.clone();
        let policy = crate::adapters::startup::StartupPolicy {
            concurrency: args.startup_adapter_concurrency.max(1),
            deadline: Duration::from_secs(args.startup_adapter_deadline_seconds),
        };
        tokio::spawn(async move {
            if let Some(file) = startup_adapters {
                crate::adapters::startup::load_all(st.adapters.clone(), file, policy).await;
            }
            st.adapters_ready.store(true, Ordering::SeqCst);
        });
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let app = routes::router(st.clone(), args.max_body_bytes);
    let admin_app = admin::router(st.clone(), admin_token);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let limits = ListenerLimits {
        max_connections: args.max_connections,
        header_read_timeout: Duration::from_secs_f64(args.header_read_timeout),
        ..ListenerLimits::default()
    };
    let api_task = tokio::spawn(listener::serve(api, app, limits.clone(), wait(stop_rx.clone())));
    // The admin port (operator, Prometheus, gateway) has its own connection budget, so a flood of
    // tenant connections never blinds the autoscaler or the probes there.
    let admin_limits = ListenerLimits {
        max_connections: 256,
        ..limits
    };
    let admin_task = tokio::spawn(listener::serve(admin, admin_app, admin_limits, wait(stop_rx)));
    tokio::select! {
        () = shutdown_signal() => {}
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
    tracing::info!("shutting down: refusing new requests, draining in-flight ones");
    st.draining.store(true, Ordering::SeqCst);
    st.engine.gate().close();
    let grace = Duration::from_secs(args.shutdown_grace_seconds);
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
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = api_task.await;
        let _ = admin_task.await;
    })
    .await;
    tracing::info!("stopped");
    Ok(())
}

/// Registers vLLM's metric aliases now that the pool and the context are known.
fn init_vllm_metrics(
    metrics: &crate::metrics::RuntimeMetrics,
    name: &str,
    engine: &EngineHandle,
    args: &ServeArgs,
) {
    let c = &engine.model_dir().config;
    let elem = args.kv_cache_dtype.kv_dtype().bytes();
    let tokens = engine.kv_capacity_tokens();
    let bytes_per_token = 2 * (c.num_layers * c.num_kv_heads * c.head_dim * elem) as u64;
    let cache = crate::metrics::vllm::CacheConfigInfo {
        block_size: args.block_size,
        num_gpu_blocks: tokens / args.block_size.max(1),
        cache_dtype: args.kv_cache_dtype.name().into(),
        enable_prefix_caching: !args.no_enable_prefix_caching,
        kv_cache_memory_bytes: tokens as u64 * bytes_per_token,
    };
    metrics.init_vllm(name, engine.max_model_len(), &cache);
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
