//! [`Engine`]: the one object the scheduler's step loop owns — a loaded model directory (tokenizer,
//! template, EOS ids), the kernels backend, the weights uploaded to it and the KV-cache storage — with
//! [`Engine::step`] running one ragged batch.
//!
//! Invariants: only the step loop touches an `Engine` (docs/design.md: "one thread owns the engine"), so it
//! needs no locks; the KV storage is sized once at load from [`EngineConfig`] and never reallocated;
//! `max_model_len` never exceeds the model's `max_position_embeddings`.

use crate::ModelDir;
use crate::error::{EngineError, Result};
use crate::kv::sizing::default_pool_blocks;
use crate::kv::{KvCache, KvGroups};
use crate::lora::LoraAdapter;
use crate::model::lora::LoraWeights;
use crate::model::{Decoder, Logits, SeqInput};
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
    /// KV blocks in the pool (`serve` passes what [`crate::kv::sizing::plan_pool`] derived from
    /// `--num-kv-blocks`, `--kv-cache-memory-bytes` or the memory limit); `None` = the default pool
    /// ([`crate::kv::sizing::default_pool_blocks`]).
    pub num_kv_blocks: Option<usize>,
    /// Context limit (`--max-model-len`); `None` = the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    /// Sequences the default pool is sized for when `num_kv_blocks` is `None` (`--max-num-seqs`).
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
    model: Decoder<K>,
    cache: KvCache<K>,
    max_model_len: usize,
    /// Adapters uploaded to the backend, by [`LoraAdapter::id`], with the step that last used them.
    loras: HashMap<u64, (LoraWeights<K>, u64)>,
    max_loras: usize,
    steps: u64,
    /// A draft model for speculative decoding, run on the same kernels with its own KV storage.
    draft: Option<Draft<K>>,
}

/// A speculative-decoding draft model: weights and KV storage (its block tables are the scheduler's).
struct Draft<K: Kernels> {
    model: Decoder<K>,
    cache: KvCache<K>,
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
        if cfg.kv_cache_dtype == KvDType::Q8_0 && !model_dir.config.head_dim.is_multiple_of(2) {
            return Err(EngineError::InvalidParam {
                field: "kv_cache_dtype",
                message: format!(
                    "q8_0 needs an even head_dim (its scales follow the elements on 2-byte boundaries); this model's is {}",
                    model_dir.config.head_dim
                ),
            });
        }
        let mut config = model_dir.config.clone();
        config.serving_context = max_model_len;
        let blocks = cfg.num_kv_blocks.unwrap_or_else(|| {
            let groups = KvGroups::new(&config.layer_windows(max_model_len));
            let step = crate::sched::SchedulerConfig::default().max_num_batched_tokens;
            default_pool_blocks(&groups, cfg.max_num_seqs, max_model_len, step, cfg.block_size)
        });
        let model = Decoder::load(&kernels, config, &model_dir.weights)?;
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
            draft: None,
        })
    }

    /// Runs one step over a ragged batch (see [`Decoder::forward`]).
    pub fn step(&mut self, batch: &[SeqInput<'_>]) -> Result<Logits> {
        self.step_lora(batch, &[])
    }

    /// Runs one step in which sequence `i` uses `adapters[batch[i].adapter]` (see
    /// [`Decoder::forward_lora`]). Adapters are uploaded on first use and kept while at most
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

    /// Loads `md` as the draft model of speculative decoding, with `num_kv_blocks` KV blocks of this
    /// engine's block size and element type. Refused, naming the difference, unless its tokenizer's
    /// vocabulary and special tokens, its logits width and its EOS ids are this model's, and its
    /// context reaches this engine's `max_model_len`.
    pub fn attach_draft(&mut self, md: ModelDir, num_kv_blocks: usize) -> Result<()> {
        let target = &self.model_dir;
        let bad = |message: String| EngineError::InvalidParam {
            field: "speculative_config.model",
            message: format!(
                "the draft model {} cannot draft for {}: {message}",
                md.path.display(),
                target.path.display()
            ),
        };
        if let Some(d) = target.tokenizer.vocabulary_difference(&md.tokenizer) {
            return Err(bad(format!("its tokenizer differs ({d})")));
        }
        if md.config.vocab_size != target.config.vocab_size {
            return Err(bad(format!(
                "vocab_size {} vs {}",
                md.config.vocab_size, target.config.vocab_size
            )));
        }
        if md.eos_token_ids != target.eos_token_ids || md.bos_token != target.bos_token {
            return Err(bad(format!(
                "EOS ids {:?} / BOS {:?} vs {:?} / {:?}",
                md.eos_token_ids, md.bos_token, target.eos_token_ids, target.bos_token
            )));
        }
        if md.config.max_position_embeddings < self.max_model_len {
            return Err(bad(format!(
                "its context ({}) is shorter than max_model_len ({})",
                md.config.max_position_embeddings, self.max_model_len
            )));
        }
        if self.cache.layout.dtype == KvDType::Q8_0 && !md.config.head_dim.is_multiple_of(2) {
            return Err(bad(format!(
                "its head_dim ({}) is odd, which a q8_0 KV cache cannot hold",
                md.config.head_dim
            )));
        }
        let mut config = md.config.clone();
        config.serving_context = self.max_model_len;
        let model = Decoder::load(&self.kernels, config, &md.weights)?;
        let layout = &self.cache.layout;
        let cache = model.new_kv_cache_as(&self.kernels, num_kv_blocks, layout.block_size, layout.dtype);
        self.draft = Some(Draft { model, cache });
        Ok(())
    }

    /// KV blocks of the draft model's storage, if one is attached.
    pub fn draft_num_kv_blocks(&self) -> Option<usize> {
        self.draft.as_ref().map(|d| d.cache.layout.num_blocks)
    }

    /// The draft model's KV-cache groups, if one is attached.
    pub fn draft_kv_groups(&self) -> Option<&KvGroups> {
        self.draft.as_ref().map(|d| d.model.kv_groups())
    }

    /// Runs one pass of the draft model over `batch` (block tables index the draft's own storage).
    pub fn draft_step(&mut self, batch: &[SeqInput<'_>]) -> Result<Logits> {
        let max = self.max_model_len;
        let d = self
            .draft
            .as_mut()
            .ok_or_else(|| EngineError::Batch("no draft model is attached".into()))?;
        if let Some(s) = batch.iter().find(|s| s.start_pos + s.tokens.len() > max) {
            return Err(EngineError::Batch(format!(
                "a draft sequence reaches {} tokens, past max_model_len ({max})",
                s.start_pos + s.tokens.len()
            )));
        }
        d.model.forward(&self.kernels, batch, &mut d.cache)
    }

    /// [`Self::recycle`] for the draft model's logits.
    pub fn recycle_draft(&self, logits: Logits) {
        if let Some(d) = &self.draft {
            d.model.recycle(logits);
        }
    }

    /// Hands a step's logits back once read, so the next step reuses their memory
    /// ([`Decoder::recycle`]).
    pub fn recycle(&self, logits: Logits) {
        self.model.recycle(logits);
    }

    /// Frees the buffers kept from step to step ([`Decoder::release_scratch`]).
    pub fn release_scratch(&self) {
        self.model.release_scratch();
        if let Some(d) = &self.draft {
            d.model.release_scratch();
        }
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

    /// How the model's layers share the KV blocks (one table per group per sequence).
    pub fn kv_groups(&self) -> &KvGroups {
        self.model.kv_groups()
    }

    /// The longest request (tokens) the KV pool holds alone, computed in steps of at most `step`
    /// tokens: the pool's tokens, or more where window groups give blocks back.
    pub fn kv_capacity_tokens(&self, step: usize) -> usize {
        self.kv_groups()
            .tokens_fitting(self.num_kv_blocks(), step, self.block_size())
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
