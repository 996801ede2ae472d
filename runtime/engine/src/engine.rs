//! [`Engine`]: the one object the scheduler's step loop owns — a loaded model directory (tokenizer,
//! template, EOS ids), the kernels backend, the weights uploaded to it and the KV-cache storage — with
//! [`Engine::step`] running one ragged batch.
//!
//! Invariants: only the step loop touches an `Engine` (docs/design.md: "one thread owns the engine"), so it
//! needs no locks; the KV storage is sized once at load from [`EngineConfig`] and never reallocated;
//! `max_model_len` never exceeds the model's `max_position_embeddings`.

use crate::ModelDir;
use crate::error::{EngineError, Result};
use crate::kv::KvCache;
use crate::lora::LoraAdapter;
use crate::model::lora::LoraWeights;
use crate::model::{LlamaModel, Logits, SeqInput};
use modelfleet_kernels::cpu::CpuKernels;
use modelfleet_kernels::{Kernels, KvDType};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// How to load an engine (vLLM's flag names where vLLM has one).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Compute threads (0 = one per core); several pods may share a node (`--threads`).
    pub threads: usize,
    /// Tokens per KV block (`--block-size`).
    pub block_size: usize,
    /// KV blocks in the pool (`--num-kv-blocks`); `None` = enough for `max_num_seqs` full contexts.
    pub num_kv_blocks: Option<usize>,
    /// Context limit (`--max-model-len`); `None` = the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    /// Sequences the pool is sized for when `num_kv_blocks` is `None` (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// LoRA adapters kept uploaded to the kernels backend (`--max-loras`; the scheduler puts at most
    /// this many in one step).
    pub max_loras: usize,
    /// Element type of the KV cache (`--kv-cache-dtype`).
    pub kv_cache_dtype: KvDType,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: 0,
            block_size: 16,
            num_kv_blocks: None,
            max_model_len: None,
            max_num_seqs: 4,
            max_loras: 4,
            kv_cache_dtype: KvDType::F32,
        }
    }
}

/// A model ready to run.
pub struct Engine<K: Kernels = CpuKernels> {
    /// Config, tokenizer, chat template and EOS ids of the model (shared with the HTTP side, which
    /// tokenizes and renders templates without touching the step loop).
    pub model_dir: Arc<ModelDir>,
    kernels: K,
    model: LlamaModel<K>,
    cache: KvCache<K>,
    max_model_len: usize,
    /// Adapters uploaded to the backend, by [`LoraAdapter::id`], with the step that last used them.
    loras: HashMap<u64, (LoraWeights<K>, u64)>,
    max_loras: usize,
    steps: u64,
}

impl Engine<CpuKernels> {
    /// Loads the model at `path` (a Hugging Face directory or a GGUF file) on the CPU backend.
    pub fn load(path: &Path, cfg: &EngineConfig) -> Result<Self> {
        Self::load_with(ModelDir::open(path)?, CpuKernels::new(cfg.threads), cfg)
    }
}

impl<K: Kernels> Engine<K> {
    /// Loads an opened model directory onto `kernels`.
    pub fn load_with(model_dir: ModelDir, kernels: K, cfg: &EngineConfig) -> Result<Self> {
        let limit = model_dir.config.max_position_embeddings;
        let max_model_len = cfg.max_model_len.unwrap_or(limit);
        if max_model_len == 0 || max_model_len > limit {
            return Err(EngineError::InvalidParam {
                field: "max_model_len",
                message: format!(
                    "must be in [1, {limit}] (the model's max_position_embeddings), got {max_model_len}"
                ),
            });
        }
        if cfg.block_size == 0 {
            return Err(EngineError::InvalidParam {
                field: "block_size",
                message: "must be >= 1, got 0".into(),
            });
        }
        let blocks = cfg
            .num_kv_blocks
            .unwrap_or(cfg.max_num_seqs.max(1) * max_model_len.div_ceil(cfg.block_size));
        let model = LlamaModel::load(&kernels, model_dir.config.clone(), &model_dir.weights)?;
        let cache = model.new_kv_cache_as(&kernels, blocks, cfg.block_size, cfg.kv_cache_dtype);
        let mut model_dir = model_dir;
        model_dir.weights.release_maps();
        Ok(Self {
            model_dir: Arc::new(model_dir),
            kernels,
            model,
            cache,
            max_model_len,
            loras: HashMap::new(),
            max_loras: cfg.max_loras,
            steps: 0,
        })
    }

    /// Runs one step over a ragged batch (see [`LlamaModel::forward`]).
    pub fn step(&mut self, batch: &[SeqInput<'_>]) -> Result<Logits> {
        self.step_lora(batch, &[])
    }

    /// Runs one step in which sequence `i` uses `adapters[batch[i].adapter]` (see
    /// [`LlamaModel::forward_lora`]). Adapters are uploaded on first use and kept while at most
    /// `max_loras` are resident; the least recently used one not in this step is dropped first.
    pub fn step_lora(&mut self, batch: &[SeqInput<'_>], adapters: &[Arc<LoraAdapter>]) -> Result<Logits> {
        if let Some(s) = batch
            .iter()
            .find(|s| s.start_pos + s.tokens.len() > self.max_model_len)
        {
            return Err(EngineError::Batch(format!(
                "a sequence reaches {} tokens, past max_model_len ({})",
                s.start_pos + s.tokens.len(),
                self.max_model_len
            )));
        }
        self.steps += 1;
        let layers = self.model.config().num_layers;
        for a in adapters {
            let entry = self
                .loras
                .entry(a.id)
                .or_insert_with(|| (LoraWeights::upload(&self.kernels, a, layers), 0));
            entry.1 = self.steps;
        }
        while self.loras.len() > self.max_loras.max(adapters.len()) {
            let oldest = self
                .loras
                .iter()
                .filter(|(_, (_, used))| *used < self.steps)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(id, _)| *id);
            match oldest {
                Some(id) => self.loras.remove(&id),
                None => break,
            };
        }
        let weights: Vec<&LoraWeights<K>> = adapters.iter().map(|a| &self.loras[&a.id].0).collect();
        self.model
            .forward_lora(&self.kernels, batch, &weights, &mut self.cache)
    }

    /// Hands a step's logits back once read, so the next step reuses their memory
    /// ([`LlamaModel::recycle`]).
    pub fn recycle(&self, logits: Logits) {
        self.model.recycle(logits);
    }

    /// Frees the buffers kept from step to step ([`LlamaModel::release_scratch`]).
    pub fn release_scratch(&self) {
        self.model.release_scratch();
    }

    /// Adapters currently uploaded to the backend.
    pub fn resident_loras(&self) -> usize {
        self.loras.len()
    }

    /// The context limit in force.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// KV blocks in the storage (size the scheduler's block pool with this).
    pub fn num_kv_blocks(&self) -> usize {
        self.cache.layout.num_blocks
    }

    /// Tokens per KV block.
    pub fn block_size(&self) -> usize {
        self.cache.layout.block_size
    }

    /// Bytes of KV-cache storage.
    pub fn kv_cache_bytes(&self) -> usize {
        self.cache.bytes()
    }

    /// The backend, e.g. for [`Kernels::describe`].
    pub fn kernels(&self) -> &K {
        &self.kernels
    }
}
