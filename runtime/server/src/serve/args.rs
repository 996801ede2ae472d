//! `serve`'s flags ([`ServeArgs`]), each also from `MODELFLEET_<FLAG_IN_CAPS>`, with vLLM's names where
//! vLLM has the flag. What they mean together is checked once, by [`ServeArgs::validate`] (config.rs).

use super::memory;
use super::state::CacheScope;
use modelfleet_engine::kernels::KvDType;
use std::path::PathBuf;

/// `--max-num-seqs` default (also `plan`'s, whose arithmetic must match).
pub const DEFAULT_MAX_NUM_SEQS: usize = 64;
/// `--max-num-batched-tokens` default.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 512;
/// `--block-size` default.
pub const DEFAULT_BLOCK_SIZE: usize = 16;
/// `--max-lora-rank` default.
pub const DEFAULT_MAX_LORA_RANK: usize = 16;

/// `--task`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Task {
    /// Chat and completions.
    Generate,
    /// Embeddings.
    Embed,
}

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
    /// 8-bit integers with an f16 scale per head vector (llama.cpp's `-ctk q8_0 -ctv q8_0`, with a
    /// scale per head vector rather than per 32 elements).
    #[value(name = "q8_0", alias = "int8", alias = "q8")]
    Q8_0,
}

/// `--bf16-dot`: which float matrices run on AVX-512 BF16 dot products (where the CPU has them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Bf16DotArg {
    /// None: f32, f16 and bf16 matrices on exact f32 products.
    Off,
    /// bf16 matrices (weights exact, activations rounded to bf16).
    Bf16,
    /// f16 matrices too (weights rounded to bf16: 8 of their 11 significant bits).
    All,
}

impl Bf16DotArg {
    /// The kernels' setting.
    pub fn mode(self) -> modelfleet_engine::kernels::cpu::Bf16Dot {
        use modelfleet_engine::kernels::cpu::Bf16Dot;
        match self {
            Bf16DotArg::Off => Bf16Dot::Off,
            Bf16DotArg::Bf16 => Bf16Dot::Bf16,
            Bf16DotArg::All => Bf16Dot::All,
        }
    }
}

impl KvCacheDType {
    /// The engine's element type.
    pub fn kv_dtype(self) -> KvDType {
        match self {
            KvCacheDType::Auto | KvCacheDType::Float32 => KvDType::F32,
            KvCacheDType::Float16 => KvDType::F16,
            KvCacheDType::Q8_0 => KvDType::Q8_0,
        }
    }

    /// The flag's value, as `vllm:cache_config_info` reports it.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDType::Auto => "auto",
            KvCacheDType::Float32 => "float32",
            KvCacheDType::Float16 => "float16",
            KvCacheDType::Q8_0 => "q8_0",
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
    /// The bytes were verified before this process started (the pod's fetch container did it): check
    /// the digest again *beside* loading the model instead of before it — nothing is served until both
    /// are done — so a pod is Ready sooner. Without it the digest is checked before a byte is parsed.
    #[arg(long, env = "MODELFLEET_VERIFY_BESIDE_LOAD")]
    pub verify_beside_load: bool,
    /// What the model must do: `generate` (chat, completions) or `embed` (`/v1/embeddings`). Unset, the
    /// model's files decide (an encoder embeds); set, a model that does the other fails the start.
    #[arg(long, env = "MODELFLEET_TASK", value_enum)]
    pub task: Option<Task>,
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
    /// Float matrices on AVX-512 BF16 dot products where the CPU has them: `all` (f16 weights rounded
    /// to bf16, and bf16 ones), `bf16` (bf16 weights only) or `off` (exact f32 products); `all` gives
    /// f16 about 1.6× the prefill at a measured cost in accuracy (docs/benchmarks.md).
    #[arg(long, env = "MODELFLEET_BF16_DOT", value_enum, default_value = "all")]
    pub bf16_dot: Bf16DotArg,
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
    /// reads, rounding each cached key and value to f16; `q8_0` stores 8-bit integers with an f16
    /// scale per head vector: about 1.9× the tokens of `float16` in the same memory.
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
    /// Seconds a keep-alive connection with nothing in flight stays open (longer than clients' pool
    /// idle timeouts, so clients close idle connections first).
    #[arg(long, env = "MODELFLEET_IDLE_TIMEOUT", default_value_t = 120.0)]
    pub idle_timeout: f64,
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
    /// With `--enable-fault-injection`: answer this percent of generation requests with a 500, spread
    /// evenly (a bad revision for canary drills).
    #[arg(
        long,
        env = "MODELFLEET_FAULT_ERROR_PERCENT",
        hide = true,
        default_value_t = 0
    )]
    pub fault_error_percent: u32,
    /// With `--enable-fault-injection`: hold every generation request this many milliseconds before
    /// it is scheduled (a slow revision for canary drills).
    #[arg(long, env = "MODELFLEET_FAULT_DELAY_MS", hide = true, default_value_t = 0)]
    pub fault_delay_ms: u64,
    /// Speculative decoding, as vLLM's JSON: `{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_max": 4}` or `{"model": PATH, "num_speculative_tokens": 3}` (see docs/operations.md).
    #[arg(long, env = "MODELFLEET_SPECULATIVE_CONFIG")]
    pub speculative_config: Option<String>,
    /// Where a start-up failure's one-line reason goes (written only if the file exists, as in a pod,
    /// unless the flag is given explicitly).
    #[arg(long, env = "MODELFLEET_TERMINATION_LOG")]
    pub termination_log: Option<PathBuf>,
    /// Logs and traces (docs/operations.md, "Traces").
    #[command(flatten)]
    pub telemetry: modelfleet_telemetry::TelemetryArgs,
}
