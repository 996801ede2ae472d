//! `modelfleet-runtime plan`: the memory arithmetic of a model before it is deployed — weight bytes (per
//! element type, as the CPU kernels hold them: as stored, Q6_K +31%), KV bytes per token, per request at the longest context and for C requests,
//! FLOPs per token, and whether it all fits a memory size, with the KV pool `serve` would allocate
//! there (the same code sizes both: `kv::sizing`).
//!
//! Input: `--model PATH` (what `serve --model` takes: weights counted as held) or `--config
//! config.json` (a Hugging Face config alone: weights estimated as parameters × `torch_dtype`). Output:
//! text, or `--output json` for tools.
//!
//! Invariants: the sizing flags default to `serve`'s (`--kv-cache-dtype auto` = float32, `--block-size`,
//! `--max-num-seqs`, `--max-num-batched-tokens`, `--max-lora-rank`), so the same flags give the same
//! pool; nothing is loaded beyond the config and the weight files' headers (weights are mapped, never
//! read).

pub mod report;

use crate::serve::memory::{PoolSettings, parse_bytes};
use crate::serve::{
    DEFAULT_BLOCK_SIZE, DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS,
    KvCacheDType,
};
use anyhow::Context;
use modelfleet_engine::ModelDir;
use modelfleet_engine::model::ModelConfig;
use report::{DTypeBytes, Input, Report};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Text or JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One figure per line.
    Text,
    /// One JSON object (the fields of the text form, exact integers).
    Json,
}

/// `plan` flags.
#[derive(clap::Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["model", "config"])))]
pub struct PlanArgs {
    /// A model as `serve --model` takes it (Hugging Face directory or GGUF): weights counted as held.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// A Hugging Face `config.json` alone: weights estimated as parameters × its `torch_dtype`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The context the figures are for (default: the model's).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Requests of `--max-model-len` tokens to hold at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// KV element type; the default `auto` is float32, the same as `serve`'s.
    #[arg(long, value_enum, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDType,
    /// The memory to fit in (a container's limit): bytes, or with a unit (`16Gi`, `16G`, `16g`).
    #[arg(long, value_parser = parse_bytes)]
    pub memory: Option<u64>,
    /// Tokens per KV block (as `serve`).
    #[arg(long, default_value_t = DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
    /// Most sequences in one step (as `serve`; sizes the logits workspace).
    #[arg(long, default_value_t = DEFAULT_MAX_NUM_SEQS)]
    pub max_num_seqs: usize,
    /// Most tokens in one step (as `serve`; sizes the activation workspace).
    #[arg(long, default_value_t = DEFAULT_MAX_NUM_BATCHED_TOKENS)]
    pub max_num_batched_tokens: usize,
    /// Largest LoRA rank (as `serve`; sizes LoRA's step buffers).
    #[arg(long, default_value_t = DEFAULT_MAX_LORA_RANK)]
    pub max_lora_rank: usize,
    /// `text` or `json`.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Runs `plan`: prints the report, exit 0; a bad input is one line on stderr, exit 1.
pub fn run(args: PlanArgs) -> ExitCode {
    match plan(&args) {
        Ok(r) => {
            match args.output {
                Output::Text => print!("{}", r.text()),
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&r).expect("the report serialises")
                ),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("modelfleet-runtime plan: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The report for `args`.
pub fn plan(args: &PlanArgs) -> anyhow::Result<Report> {
    if args.concurrency == 0 || args.block_size == 0 {
        anyhow::bail!(
            "--concurrency and --block-size must be >= 1 (got {} and {})",
            args.concurrency,
            args.block_size
        );
    }
    let (name, config, weights) = match (&args.model, &args.config) {
        (Some(path), _) => {
            let md = ModelDir::open(path).with_context(|| format!("--model {}", path.display()))?;
            let weights = md
                .weights
                .stored_bytes()
                .into_iter()
                .map(|(dtype, bytes)| DTypeBytes {
                    bytes: crate::serve::memory::held_bytes(&dtype, bytes),
                    dtype,
                })
                .collect();
            (
                path.clone(),
                md.config,
                (weights, "as held (stored; Q6_K +31%)".to_string()),
            )
        }
        (None, Some(path)) => {
            let config =
                ModelConfig::from_file(path).with_context(|| format!("--config {}", path.display()))?;
            let weights = estimated_weights(path, &config)?;
            (path.clone(), config, weights)
        }
        (None, None) => anyhow::bail!("give --model PATH or --config config.json"),
    };
    let limit = config.max_position_embeddings;
    if let Some(l) = args.max_model_len
        && !(1..=limit).contains(&l)
    {
        anyhow::bail!(
            "--max-model-len must be in [1, {limit}] (the model's max_position_embeddings), got {l}"
        );
    }
    Ok(report::compute(&Input {
        model: name.display().to_string(),
        config: &config,
        weights,
        kv_cache_dtype: args.kv_cache_dtype.name(),
        settings: PoolSettings {
            block_size: args.block_size,
            kv_dtype: args.kv_cache_dtype.kv_dtype(),
            max_model_len: args.max_model_len,
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: args.max_num_batched_tokens,
            max_lora_rank: args.max_lora_rank,
        },
        concurrency: args.concurrency,
        memory: args.memory,
    }))
}

/// Weights of a bare config: parameters × the bytes of its `torch_dtype` (or `dtype`).
fn estimated_weights(path: &Path, c: &ModelConfig) -> anyhow::Result<(Vec<DTypeBytes>, String)> {
    let raw: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)
        .with_context(|| format!("--config {}", path.display()))?;
    let torch = raw
        .get("torch_dtype")
        .or_else(|| raw.get("dtype"))
        .and_then(|v| v.as_str())
        .unwrap_or("bfloat16");
    let (dtype, bytes) = match torch {
        "float32" => ("f32", 4),
        "float16" => ("f16", 2),
        "bfloat16" => ("bf16", 2),
        other => anyhow::bail!(
            "--config {}: torch_dtype {other:?} is not one of float32, float16, bfloat16",
            path.display()
        ),
    };
    let params = report::parameters(c).total;
    Ok((
        vec![DTypeBytes {
            dtype: dtype.into(),
            bytes: params * bytes,
        }],
        format!("estimated: parameters x {torch}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        plan: PlanArgs,
    }

    /// The worked example's model (Llama-3-70B's published config).
    fn seed_config() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/llama-3-70b-config.json")
    }

    fn run_plan(extra: &[&str]) -> Report {
        let config = seed_config();
        let mut argv = vec!["plan", "--config", config.to_str().unwrap()];
        argv.extend(extra);
        plan(&Cli::parse_from(argv).plan).unwrap()
    }

    /// Qwen3-30B-A3B's published config: 30.5 B parameters, 3.3 B activated (with the embedding).
    #[test]
    fn a_mixture_of_experts_counts_its_active_parameters_in_the_flops() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        std::fs::write(
            &config,
            r#"{"architectures":["Qwen3MoeForCausalLM"],"hidden_size":2048,"intermediate_size":6144,
            "moe_intermediate_size":768,"num_hidden_layers":48,"num_attention_heads":32,
            "num_key_value_heads":4,"head_dim":128,"vocab_size":151936,"max_position_embeddings":40960,
            "rms_norm_eps":1e-6,"rope_theta":1000000.0,"tie_word_embeddings":false,"num_experts":128,
            "num_experts_per_tok":8,"norm_topk_prob":true,"decoder_sparse_step":1,"mlp_only_layers":[],
            "torch_dtype":"bfloat16"}"#,
        )
        .unwrap();
        let argv = ["plan", "--config", config.to_str().unwrap()];
        let r = plan(&Cli::parse_from(argv).plan).unwrap();
        let (h, layers) = (2048u64, 48u64);
        let attention = h * 4096 + 2 * h * 512 + 4096 * h;
        let router = 128 * h;
        let expert = 3 * h * 768;
        let vocab = 151_936 * h;
        assert_eq!(
            r.parameters.matmul,
            layers * (attention + router + 8 * expert) + vocab
        );
        let norms = layers * (2 * h + 2 * 128) + h;
        assert_eq!(
            r.parameters.total,
            2 * vocab + layers * (attention + router + 128 * expert) + norms
        );
        // The published figures: 30.5 B in all, 3.3 B activated counting the embedding lookup.
        assert_eq!(r.parameters.total / 100_000_000, 305);
        assert_eq!((r.parameters.matmul + vocab) / 100_000_000, 33);
        assert_eq!(r.flops_per_token.matmul, 2 * r.parameters.matmul);
    }

    #[test]
    fn the_worked_example_exactly() {
        // 80 layers x 8 KV heads x head dim 128 x 2 bytes x 2 (K and V) = 320 KiB per token;
        // 8,192 tokens = 2.5 GiB; weights 70,553,706,496 parameters x 2 bytes (bfloat16).
        let r = run_plan(&[
            "--max-model-len",
            "8192",
            "--kv-cache-dtype",
            "float16",
            "--concurrency",
            "8",
        ]);
        assert_eq!(r.kv_bytes_per_token, 320 * 1024);
        assert_eq!(r.kv_bytes_per_request, 5 << 29);
        assert_eq!(r.kv_bytes_for_concurrency, 20 << 30);
        assert_eq!(r.parameters.total, 70_553_706_496);
        assert_eq!(r.weight_bytes, 2 * 70_553_706_496);
        assert_eq!(r.weights[0].dtype, "bf16");
        // 2 x (70.55 G - 1.05 G embedding lookups) + 4 x 80 x 8192 x 64 x 128.
        assert_eq!(
            r.flops_per_token.matmul,
            2 * (70_553_706_496 - 128_256 * 8192 - 80 * 2 * 8192 - 8192)
        );
        assert_eq!(r.flops_per_token.attention_at_max_len, 4 * 80 * 8192 * 64 * 128);
        // The default KV type is float32, as serve's: twice the bytes.
        assert_eq!(
            run_plan(&["--max-model-len", "8192"]).kv_bytes_per_token,
            640 * 1024
        );
    }

    #[test]
    fn an_8_bit_cache_holds_1_9x_the_tokens_of_f16() {
        // 80 layers x 8 KV heads x (128 bytes + a 2-byte scale) x 2 = 166,400 bytes per token.
        let q8 = run_plan(&["--max-model-len", "8192", "--kv-cache-dtype", "q8_0"]);
        assert_eq!(q8.kv_bytes_per_token, 2 * 80 * 8 * 130);
        assert_eq!(q8.kv_bytes_per_token_float16, 320 * 1024);
        let text = q8.text();
        assert!(text.contains("1.97x the tokens of float16"), "{text}");
        let pool = |dtype: &str| {
            run_plan(&[
                "--max-model-len",
                "8192",
                "--kv-cache-dtype",
                dtype,
                "--memory",
                "160g",
            ])
            .memory
            .unwrap()
        };
        let (f16, q8) = (pool("float16"), pool("q8_0"));
        assert_eq!(f16.kv_pool_bytes, q8.kv_pool_bytes);
        let ratio = q8.kv_tokens as f64 / f16.kv_tokens as f64;
        assert!(ratio >= 1.9, "{} vs {} tokens", q8.kv_tokens, f16.kv_tokens);
    }

    #[test]
    fn memory_fit_follows_the_pool_arithmetic() {
        let fit = |mem: &str, c: &str| {
            run_plan(&[
                "--max-model-len",
                "8192",
                "--kv-cache-dtype",
                "float16",
                "--memory",
                mem,
                "--concurrency",
                c,
            ])
            .memory
            .unwrap()
        };
        // Two 80 GB GPUs' worth: 160 GB - 141.1 GB weights - workspace - headroom.
        let m = fit("160g", "4");
        let r = run_plan(&["--max-model-len", "8192", "--kv-cache-dtype", "float16"]);
        let expected_pool = 160_000_000_000 - r.weight_bytes - r.workspace_bytes - m.headroom_bytes;
        assert_eq!(m.kv_pool_bytes, expected_pool);
        assert_eq!(m.kv_blocks as u64, expected_pool / (16 * 320 * 1024));
        assert_eq!(m.requests_at_max_len, m.kv_blocks / 512);
        assert_eq!(m.fits, m.requests_at_max_len >= 4);
        // Less memory than the weights: nothing left, and it says no.
        let tiny = fit("100g", "1");
        assert_eq!((tiny.kv_blocks, tiny.fits), (0, false));
    }

    #[test]
    fn bad_inputs_are_named() {
        let config = seed_config();
        let c = config.to_str().unwrap();
        let err = |argv: &[&str]| plan(&Cli::parse_from(argv).plan).unwrap_err().to_string();
        assert!(err(&["plan", "--config", c, "--max-model-len", "999999"]).contains("--max-model-len"));
        assert!(err(&["plan", "--config", c, "--concurrency", "0"]).contains("--concurrency"));
        assert!(err(&["plan", "--config", "/nonexistent/config.json"]).contains("--config"));
        assert!(Cli::try_parse_from(["plan"]).is_err(), "an input is required");
        assert!(Cli::try_parse_from(["plan", "--config", c, "--memory", "lots"]).is_err());
    }
}
