//! A model loaded as a whole from what `serve --model PATH` names (docs/design.md): a Hugging Face directory
//! (`config.json`, the safetensors weights — mapped, not yet uploaded to a backend — `tokenizer.json`,
//! `tokenizer_config.json` with the chat template and BOS/EOS, `generation_config.json`), a single
//! `.gguf` file, or a directory holding exactly one `.gguf` file (config, tokenizer and template then
//! come from the GGUF metadata).
//!
//! Invariants: opening validates everything that can be validated without running the model — the
//! config, the tokenizer, the chat template's syntax — so a bad artifact fails at start-up with the file
//! and field named, never on the first request. EOS ids are the union of `generation_config.json`,
//! `config.json` and the tokenizer's `eos_token`, in that order (Llama 3 lists `<|eot_id|>` only in the
//! first).

use crate::error::{EngineError, Result};
use crate::model::gguf::GgufFile;
use crate::model::{ModelConfig, Weights};
use crate::tokenizer::{ChatTemplate, GenerationConfig, Tokenizer, TokenizerConfig};
use std::path::{Path, PathBuf};

/// Everything in a model directory.
pub struct ModelDir {
    /// The directory.
    pub path: PathBuf,
    /// `config.json`.
    pub config: ModelConfig,
    /// The memory-mapped weights (released by [`crate::Engine`] once loaded: see
    /// [`Weights::release_maps`]).
    pub weights: Weights,
    /// `tokenizer.json`.
    pub tokenizer: Tokenizer,
    /// The chat template, if `tokenizer_config.json` has one.
    pub chat_template: Option<ChatTemplate>,
    /// `generation_config.json` (empty when absent).
    pub generation: GenerationConfig,
    /// Ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// `bos_token` as text, if any.
    pub bos_token: Option<String>,
}

impl ModelDir {
    /// Opens and validates the model at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(file) = gguf_file(path)? {
            return Self::open_gguf(&file);
        }
        let config = ModelConfig::from_file(&path.join("config.json"))?;
        let tokenizer = Tokenizer::from_file(&path.join("tokenizer.json"))?;
        let tk_config = TokenizerConfig::from_file(&path.join("tokenizer_config.json"))?;
        let generation = GenerationConfig::from_file(&path.join("generation_config.json"))?;
        let chat_template = chat_template_of(&tk_config)?;
        let mut eos_token_ids = Vec::new();
        let from_tokenizer = tk_config
            .eos_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t));
        for id in generation
            .eos_token_ids
            .iter()
            .chain(&config.eos_token_ids)
            .copied()
            .chain(from_tokenizer)
        {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        let weights = Weights::open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            config,
            weights,
            tokenizer,
            chat_template,
            generation,
            eos_token_ids,
            bos_token: tk_config.bos_token,
        })
    }

    /// Opens a GGUF file.
    fn open_gguf(path: &Path) -> Result<Self> {
        let g = GgufFile::open(path)?;
        let config = crate::model::gguf_model::config(&g)?;
        let weights = crate::model::gguf_model::weights(&g);
        let (tokenizer, tk_config, eos_token_ids) = crate::tokenizer::gguf::from_gguf(&g)?;
        let chat_template = chat_template_of(&tk_config)?;
        Ok(Self {
            path: path.to_path_buf(),
            config,
            weights,
            tokenizer,
            chat_template,
            generation: GenerationConfig::default(),
            eos_token_ids,
            bos_token: tk_config.bos_token,
        })
    }
}

/// The GGUF file `path` designates: itself, or the only `.gguf` in a directory without `config.json`.
fn gguf_file(path: &Path) -> Result<Option<std::path::PathBuf>> {
    let is_gguf = |p: &Path| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if path.is_file() {
        return Ok(is_gguf(path).then(|| path.to_path_buf()));
    }
    if path.join("config.json").exists() {
        return Ok(None);
    }
    let entries = std::fs::read_dir(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let ggufs: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && is_gguf(p))
        .collect();
    match ggufs.len() {
        0 => Ok(None),
        1 => Ok(ggufs.into_iter().next()),
        n => Err(EngineError::Weights {
            path: path.to_path_buf(),
            tensor: "*".into(),
            message: format!("holds {n} .gguf files and no config.json; name the file to serve"),
        }),
    }
}

/// The chat template of a tokenizer config, compiled with its BOS/EOS tokens (None when it has none).
fn chat_template_of(tk_config: &TokenizerConfig) -> Result<Option<ChatTemplate>> {
    tk_config
        .chat_template
        .as_deref()
        .map(|src| {
            ChatTemplate::new(
                src,
                tk_config.bos_token.as_deref(),
                tk_config.eos_token.as_deref(),
            )
        })
        .transpose()
}
