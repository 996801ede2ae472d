//! The planner's figures: parameters and weight bytes, KV bytes per token, per request at the longest
//! context and for C requests, FLOPs per token, the step workspace, and — given a memory size — the KV
//! pool `serve` would allocate in it and whether C requests of the longest context fit.
//!
//! Invariants: the pool comes from `kv::sizing::derive_pool` with the same inputs `serve` builds
//! (`serve::memory::inputs_for`), so `plan --memory M` names the block count `serve
//! --memory-limit-bytes M` allocates; every figure is an exact integer (bytes, FLOPs), rounded only when
//! printed as text.
//!
//! The arithmetic (docs/capacity.md): weights ≈ parameters × bytes per element; KV bytes per token =
//! 2 × layers × KV heads × head dim × bytes per element; FLOPs per token ≈ 2 × the parameters a token
//! multiplies (every projection and the LM head; the embedding is a lookup) + 4 × layers × L × heads ×
//! head dim for attention at context position L (QKᵀ and AV, one multiply-add each per key; a
//! sliding-window layer's L is at most its window). With KV-cache groups (sliding-window layers) KV
//! bytes per token are a request's blocks at the longest context over its tokens.

use crate::serve::memory::{PoolSettings, inputs_for};
use modelfleet_engine::kernels::KvDType;
use modelfleet_engine::kv::sizing::{Derivation, KvShape, PoolInputs, PoolSource, derive_pool};
use modelfleet_engine::model::ModelConfig;
use serde::Serialize;

/// Parameter counts of a config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Params {
    /// Every weight (embedding, LM head if untied, projections, norms, biases).
    pub total: u64,
    /// Those a token multiplies in a forward pass: the projections and the LM head — of a MoE layer,
    /// the router and the `top_k` experts a token is routed to (its *active* parameters), not all.
    pub matmul: u64,
}

/// The parameters of `c` (what `Decoder::load` reads).
pub fn parameters(c: &ModelConfig) -> Params {
    let (h, v, i) = (
        c.hidden_size as u64,
        c.vocab_size as u64,
        c.intermediate_size as u64,
    );
    let q = (c.num_heads * c.head_dim) as u64;
    let kv = (c.num_kv_heads * c.head_dim) as u64;
    let attention = h * q + 2 * h * kv + q * h;
    let dense_ffn = 3 * h * i;
    // Per layer: (all FFN parameters, those a token multiplies).
    let ffn = |l: usize| match &c.moe {
        Some(m) if m.is_moe(l) => {
            let (n, k, f) = (m.num_experts as u64, m.top_k as u64, m.expert_ff as u64);
            (n * h + n * 3 * h * f, n * h + k * 3 * h * f)
        }
        _ => (dense_ffn, dense_ffn),
    };
    let (ffn_total, ffn_active) = (0..c.num_layers)
        .map(ffn)
        .fold((0, 0), |(t, a), (lt, la)| (t + lt, a + la));
    let biases = if c.qkv_bias { q + 2 * kv } else { 0 } + if c.o_bias { h } else { 0 };
    let layers = c.num_layers as u64;
    let embed = v * h;
    let lm_head = if c.tie_word_embeddings { 0 } else { v * h };
    // Two norms per layer, four with sandwich norms, and the per-head q/k norm vectors.
    let norms =
        if c.sandwich_norms { 4 * h } else { 2 * h } + if c.qk_norm { 2 * c.head_dim as u64 } else { 0 };
    Params {
        total: embed + lm_head + layers * (attention + biases + norms) + ffn_total + h,
        matmul: layers * attention + ffn_active + v * h,
    }
}

/// Weight bytes of one element type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DTypeBytes {
    /// `f32`, `f16`, `bf16`, `q4_1`, …
    pub dtype: String,
    /// Bytes of the tensors stored in it.
    pub bytes: u64,
}

/// FLOPs of one token's forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Flops {
    /// 2 × the multiplied parameters.
    pub matmul: u64,
    /// Attention at the last position of a `max_model_len` context.
    pub attention_at_max_len: u64,
    /// Their sum.
    pub total_at_max_len: u64,
}

/// The pool a memory size buys, and whether the asked concurrency fits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryFit {
    /// The memory size given.
    pub memory_bytes: u64,
    /// Kept out of it (fixed + a share).
    pub headroom_bytes: u64,
    /// Left for the KV pool after weights, workspace and headroom.
    pub kv_pool_bytes: u64,
    /// Blocks `serve` would allocate.
    pub kv_blocks: usize,
    /// Tokens they hold.
    pub kv_tokens: usize,
    /// Requests of `max_model_len` tokens the pool holds at once.
    pub requests_at_max_len: usize,
    /// The pool holds `concurrency` requests of `max_model_len` tokens (so `serve` starts, too).
    pub fits: bool,
}

/// Everything `plan` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The model or config named.
    pub model: String,
    /// How the weight bytes were found.
    pub weights_source: String,
    /// Parameter counts.
    pub parameters: Params,
    /// Weight bytes by element type.
    pub weights: Vec<DTypeBytes>,
    /// Their sum.
    pub weight_bytes: u64,
    /// `--kv-cache-dtype`.
    pub kv_cache_dtype: String,
    /// The context the figures are for.
    pub max_model_len: usize,
    /// K and V of one token over all layers, at `max_model_len` (a sliding-window layer's share
    /// spread over the whole context).
    pub kv_bytes_per_token: u64,
    /// `kv_bytes_per_token` with `--kv-cache-dtype float16` (what the other element types compare to).
    pub kv_bytes_per_token_float16: u64,
    /// K and V of one token over all layers as a full-attention allocation holds them (what
    /// `kv_bytes_per_token` is without KV-cache groups).
    pub kv_bytes_per_token_full_attention: u64,
    /// The KV-cache groups, when the model has sliding-window layers (`None`: every layer holds the
    /// whole context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_groups: Option<String>,
    /// One request of `max_model_len` tokens.
    pub kv_bytes_per_request: u64,
    /// Requests at once.
    pub concurrency: usize,
    /// `concurrency` requests of `max_model_len` tokens.
    pub kv_bytes_for_concurrency: u64,
    /// Tokens per block.
    pub block_size: usize,
    /// Bytes of one block (K and V of the layers a block holds).
    pub kv_bytes_per_block: u64,
    /// Per-token forward FLOPs.
    pub flops_per_token: Flops,
    /// The step buffers at `--max-num-batched-tokens`.
    pub workspace_bytes: u64,
    /// With `--memory`: the pool and the verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryFit>,
}

/// What the report is computed from.
pub struct Input<'a> {
    /// Display name of the model.
    pub model: String,
    /// The model's config.
    pub config: &'a ModelConfig,
    /// Weight bytes by type, and how they were found.
    pub weights: (Vec<DTypeBytes>, String),
    /// `--kv-cache-dtype` value name.
    pub kv_cache_dtype: &'a str,
    /// The sizing settings (the same struct `serve` fills).
    pub settings: PoolSettings,
    /// Requests at once.
    pub concurrency: usize,
    /// `--memory`.
    pub memory: Option<u64>,
}

/// The KV figures of one request of `max_model_len` tokens.
struct KvFigures {
    /// Its bytes over its tokens.
    per_token: u64,
    /// Its bytes while it decodes.
    per_request: u64,
    /// Every layer's K and V for one token, as a full-attention allocation holds them.
    full_per_token: u64,
    /// Blocks it holds while it decodes, and at most (in a prefill step).
    steady_blocks: usize,
    peak_blocks: usize,
    /// Whether the model has sliding-window KV-cache groups.
    grouped: bool,
}

impl KvFigures {
    fn of(c: &ModelConfig, p: &PoolInputs) -> Self {
        let (len, groups, bs) = (p.max_model_len, &p.groups, p.block_size.max(1));
        let full_per_token = KvShape {
            num_layers: c.num_layers,
            ..p.shape
        }
        .bytes_per_token();
        let (steady_blocks, peak_blocks) =
            (groups.blocks_for(len, 1, bs), groups.blocks_for(len, p.step, bs));
        let grouped = groups.len() > 1 || groups.windows().iter().any(Option::is_some);
        let per_request = if grouped {
            steady_blocks as u64 * p.shape.bytes_per_token() * bs as u64
        } else {
            full_per_token * len as u64
        };
        Self {
            per_token: per_request / len.max(1) as u64,
            per_request,
            full_per_token,
            steady_blocks,
            peak_blocks,
            grouped,
        }
    }
}

/// Computes the report.
pub fn compute(input: &Input<'_>) -> Report {
    let c = input.config;
    let params = parameters(c);
    let (weights, weights_source) = input.weights.clone();
    let weight_bytes = weights.iter().map(|w| w.bytes).sum();
    let pool_inputs = inputs_for(c, weight_bytes, &input.settings);
    let len = pool_inputs.max_model_len;
    let kv = KvFigures::of(c, &pool_inputs);
    let (per_token, per_request, full_per_token) = (kv.per_token, kv.per_request, kv.full_per_token);
    let (steady, peak) = (kv.steady_blocks, kv.peak_blocks);
    // A sliding-window layer's query at position `len` scores its window's keys only.
    let attended: usize = c
        .layer_windows(len)
        .iter()
        .map(|w| w.map_or(len, |w| w.min(len)))
        .sum();
    let attention = 4 * (attended * c.num_heads * c.head_dim) as u64;
    let memory = input.memory.map(|bytes| {
        let pool = derive_pool(
            &PoolSource::MemoryLimit {
                bytes,
                origin: "--memory".into(),
            },
            &pool_inputs,
        );
        // One request may be in a prefill step, holding its window groups' step blocks beside its window.
        let requests = pool.blocks.saturating_sub(peak - steady) / steady.max(1);
        let (headroom_bytes, kv_pool_bytes) = match &pool.derivation {
            Derivation::MemoryLimit {
                headroom, pool_bytes, ..
            } => (*headroom, *pool_bytes),
            _ => (0, 0), // a memory limit always derives a memory-limit pool
        };
        MemoryFit {
            memory_bytes: bytes,
            headroom_bytes,
            kv_pool_bytes,
            kv_blocks: pool.blocks,
            kv_tokens: pool.tokens(),
            requests_at_max_len: requests,
            fits: requests >= input.concurrency.max(1),
        }
    });
    Report {
        model: input.model.clone(),
        weights_source,
        parameters: params,
        weights,
        weight_bytes,
        kv_cache_dtype: input.kv_cache_dtype.into(),
        max_model_len: len,
        kv_bytes_per_token: per_token,
        kv_bytes_per_token_float16: {
            let (hd, dtype) = (c.head_dim, pool_inputs.shape.dtype);
            per_token * KvDType::F16.vector_bytes(hd) as u64 / dtype.vector_bytes(hd).max(1) as u64
        },
        kv_bytes_per_token_full_attention: full_per_token,
        kv_groups: kv.grouped.then(|| describe_groups(&pool_inputs.groups)),
        kv_bytes_per_request: per_request,
        concurrency: input.concurrency,
        kv_bytes_for_concurrency: per_request * input.concurrency as u64,
        block_size: pool_inputs.block_size,
        kv_bytes_per_block: pool_inputs.shape.bytes_per_token() * pool_inputs.block_size.max(1) as u64,
        flops_per_token: Flops {
            matmul: 2 * params.matmul,
            attention_at_max_len: attention,
            total_at_max_len: 2 * params.matmul + attention,
        },
        workspace_bytes: pool_inputs.footprint.workspace,
        memory,
    }
}

/// `1.5 GiB`, `320.0 KiB`, `12 B`.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// `1 full-attention group, 5 sliding-window groups (512 tokens), 3 layers per block`.
fn describe_groups(g: &modelfleet_engine::kv::KvGroups) -> String {
    let full = g.windows().iter().filter(|w| w.is_none()).count();
    let mut windows: Vec<usize> = g.windows().iter().flatten().copied().collect();
    windows.dedup();
    let plural = |n: usize, what: &str| format!("{n} {what} group{}", if n == 1 { "" } else { "s" });
    let windowed = g.len() - full;
    let w: Vec<String> = windows.iter().map(|w| format!("{w} tokens")).collect();
    format!(
        "{}, {} ({}), {} layers per block",
        plural(full, "full-attention"),
        plural(windowed, "sliding-window"),
        w.join(", "),
        g.width()
    )
}

/// `1.41 G`, `270 M`.
fn human_count(n: u64) -> String {
    let (v, unit) = match n {
        n if n >= 1_000_000_000_000 => (n as f64 / 1e12, "T"),
        n if n >= 1_000_000_000 => (n as f64 / 1e9, "G"),
        n if n >= 1_000_000 => (n as f64 / 1e6, "M"),
        n if n >= 1_000 => (n as f64 / 1e3, "k"),
        n => return n.to_string(),
    };
    format!("{v:.2} {unit}")
}

impl Report {
    /// The text form: one figure per line, exact bytes with a readable size beside them.
    pub fn text(&self) -> String {
        let b = |n: u64| format!("{n} bytes ({})", human_bytes(n));
        let by_type: Vec<String> = self
            .weights
            .iter()
            .map(|w| format!("{} {}", w.dtype, human_bytes(w.bytes)))
            .collect();
        let f = self.flops_per_token;
        let mut out = vec![
            format!("model:                 {}", self.model),
            format!(
                "parameters:            {} ({} multiplied per token)",
                human_count(self.parameters.total),
                human_count(self.parameters.matmul)
            ),
            format!(
                "weights:               {} [{}] ({})",
                b(self.weight_bytes),
                by_type.join(", "),
                self.weights_source
            ),
            format!(
                "KV bytes per token:    {} (--kv-cache-dtype {}{})",
                b(self.kv_bytes_per_token),
                self.kv_cache_dtype,
                if self.kv_bytes_per_token == self.kv_bytes_per_token_float16 {
                    String::new()
                } else {
                    format!(
                        ": {:.2}x the tokens of float16 in the same memory",
                        self.kv_bytes_per_token_float16 as f64 / self.kv_bytes_per_token.max(1) as f64
                    )
                }
            ),
            format!(
                "KV per request:        {} at {} tokens",
                b(self.kv_bytes_per_request),
                self.max_model_len
            ),
            format!(
                "{:<23}{}",
                format!("KV for {} requests:", self.concurrency),
                b(self.kv_bytes_for_concurrency)
            ),
            format!(
                "FLOPs per token:       {} = {} (2 x parameters) + {} (attention at {} tokens)",
                human_count(f.total_at_max_len),
                human_count(f.matmul),
                human_count(f.attention_at_max_len),
                self.max_model_len
            ),
            format!("step workspace:        {}", b(self.workspace_bytes)),
        ];
        if let Some(g) = &self.kv_groups {
            let full = self.kv_bytes_per_token_full_attention;
            let ratio = full as f64 / self.kv_bytes_per_token.max(1) as f64;
            out.insert(
                4,
                format!(
                    "KV groups:             {g}: at {} tokens {ratio:.2}x fewer bytes than full attention on every layer ({})",
                    self.max_model_len,
                    b(full)
                ),
            );
        }
        if let Some(m) = &self.memory {
            out.push(format!(
                "memory {}: - weights - workspace - headroom {} = KV pool {} = {} blocks of {} tokens ({} tokens)",
                human_bytes(m.memory_bytes),
                human_bytes(m.headroom_bytes),
                b(m.kv_pool_bytes),
                m.kv_blocks,
                self.block_size,
                m.kv_tokens
            ));
            out.push(format!(
                "fits:                  {} ({} requests of {} tokens at once; {} asked)",
                if m.fits { "yes" } else { "no" },
                m.requests_at_max_len,
                self.max_model_len,
                self.concurrency
            ));
        }
        out.join("\n") + "\n"
    }
}
