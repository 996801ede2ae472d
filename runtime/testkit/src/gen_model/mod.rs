//! [`gen_model`] writes a random-weight Llama-family model in Hugging Face layout — `config.json`,
//! `model.safetensors`, `tokenizer.json` (a working byte-level BPE), `tokenizer_config.json` (chat
//! template, BOS/EOS) and `generation_config.json`. Tests, demos and benchmarks use it: weights are
//! random, shapes are real.
//!
//! With [`GenFormat::Gguf`] (`--format gguf`) it writes one `model.gguf` instead (llama.cpp's format, tokenizer and template in
//! the metadata), with the same weights, optionally quantized to Q8_0, Q4_0 or Q4_K.
//!
//! Families: Llama (and its Mistral, Qwen2 variants) in shapes.rs; Qwen3, Gemma 3, Qwen3-MoE and Phi-3
//! in families.rs; the Qwen3 chat format (thinking, tool calls) in qwen3.rs.
//!
//! `modelfleet-runtime gen-model DIR --shape S --seed N [--dtype D] [--format F]` is its command line.
//!
//! Invariants: the output is a pure function of (shape, seed, dtype, format) — byte-identical across
//! runs and machines — so digests of generated models are stable; DIR is created if needed and only
//! these files are written into it.

mod bpe;
mod families;
mod gguf;
mod qwen3;
mod shapes;
mod weights;

pub use shapes::Shape;

use safetensors::tensor::Dtype;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Weight dtype of the generated model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GenDType {
    /// 32-bit floats.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// GGML Q8_0 (GGUF only).
    #[value(name = "q8_0")]
    Q8_0,
    /// GGML Q4_0 (GGUF only).
    #[value(name = "q4_0")]
    Q4_0,
    /// GGML Q4_K, candle's quantizer (GGUF only; every matrix input width a multiple of 256).
    #[value(name = "q4_k")]
    Q4K,
}

/// File format of the generated model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GenFormat {
    /// Hugging Face layout: config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
    /// generation_config.json.
    #[default]
    Safetensors,
    /// One llama.cpp `model.gguf` with the tokenizer and chat template in its metadata.
    Gguf,
}

/// What to generate.
#[derive(Clone, Copy, Debug)]
pub struct GenModelOptions {
    /// The architecture and size.
    pub shape: Shape,
    /// Seed of every random value.
    pub seed: u64,
    /// Weight dtype.
    pub dtype: GenDType,
    /// File format.
    pub format: GenFormat,
}

/// Why generation failed.
#[derive(Debug, thiserror::Error)]
pub enum GenModelError {
    /// Writing a file failed.
    #[error("{path}: {message}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        message: String,
    },
    /// The tokenizer could not be built.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The dtype does not exist in the format.
    #[error("--dtype {0:?} needs --format gguf")]
    DtypeNeedsGguf(GenDType),
}

fn write(path: PathBuf, bytes: &[u8]) -> Result<(), GenModelError> {
    std::fs::write(&path, bytes).map_err(|e| GenModelError::Write {
        path,
        message: e.to_string(),
    })
}

fn pretty(v: &serde_json::Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).expect("JSON values serialise");
    s.push('\n');
    s.into_bytes()
}

/// Writes the model into `dir`.
pub fn gen_model(dir: &Path, opts: &GenModelOptions) -> Result<(), GenModelError> {
    std::fs::create_dir_all(dir).map_err(|e| GenModelError::Write {
        path: dir.into(),
        message: e.to_string(),
    })?;
    let shape = opts.shape.spec();
    let (dtype, torch_dtype) = match opts.dtype {
        GenDType::F32 => (Dtype::F32, "float32"),
        GenDType::F16 => (Dtype::F16, "float16"),
        GenDType::Bf16 => (Dtype::BF16, "bfloat16"),
        q if opts.format == GenFormat::Safetensors => return Err(GenModelError::DtypeNeedsGguf(q)),
        _ => (Dtype::F32, "float32"),
    };
    let fam = shape.family.tokens();
    let spec = bpe::BpeSpec {
        specials: fam.specials,
        added: fam.added,
        vocab_size: shape.vocab,
        bos: fam.prepend_bos.then_some(fam.bos),
    };
    let tokenizer = bpe::tokenizer_json(&spec).map_err(GenModelError::Tokenizer)?;
    if opts.format == GenFormat::Gguf {
        let tensors = weights::tensors(&shape, Dtype::F32, opts.seed);
        return gguf::write_gguf(&dir.join("model.gguf"), &shape, tensors, &tokenizer, opts.dtype);
    }
    write(dir.join("tokenizer.json"), tokenizer.as_bytes())?;
    write(dir.join("config.json"), &pretty(&shape.config_json(torch_dtype)))?;
    write(
        dir.join("tokenizer_config.json"),
        &pretty(&shape.tokenizer_config_json()),
    )?;
    write(
        dir.join("generation_config.json"),
        &pretty(&shape.generation_config_json()),
    )?;
    let path = dir.join("model.safetensors");
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(weights::tensors(&shape, dtype, opts.seed), Some(meta), &path).map_err(
        |e| GenModelError::Write {
            path: path.clone(),
            message: e.to_string(),
        },
    )?;
    // `serialize_to_file` creates the file owner-only; model files are read by other users too.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).map_err(|e| {
            GenModelError::Write {
                path,
                message: e.to_string(),
            }
        })?;
    }
    Ok(())
}
