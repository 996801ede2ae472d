//! The Llama-family decoder (Llama, Mistral, Qwen2, SmolLM) over a ragged batch with a paged KV cache.
//!
//! Per layer: RMSNorm → q/k/v projections (+bias for Qwen2) → RoPE → store K/V at the batch's slots →
//! paged attention (GQA) → output projection → residual; RMSNorm → SwiGLU MLP → residual. Then the
//! final norm and LM head on the rows that asked for logits only.
//!
//! LoRA adapters add their deltas per row group right after each targeted projection (`model::lora`).
//!
//! Invariants: each weight is applied once per step to all rows of the batch (one matmul, never a loop
//! of mat-vecs); every kernel is batch-invariant, so a sequence's logits do not depend on what else is
//! in the batch (tested in `tests/forward.rs`); a malformed batch (token out of vocabulary, block
//! table too short, position past the context) is an error, not a panic.
//!
//! Design follows `transformers`' `modeling_llama.py` for the math and vLLM's model runner for the
//! flattened batch (`positions`, `slot_mapping`, per-sequence query ranges).

use super::batch::{Logits, LogitsRows, SeqInput};
use super::config::ModelConfig;
use super::lora::{LoraPlan, LoraWeights};
use super::scratch::Scratch;
use super::weights::Weights;
use crate::error::{EngineError, Result};
use crate::kv::KvCache;
use crate::lora::Target;
use modelfleet_kernels::{AttnHeads, AttnSeq, Kernels, KvDType, KvLayout, Rope};
use std::sync::Mutex;

/// Per-pair RoPE frequency divisors (GGUF, llama3 scaling).
const ROPE_FREQS: &str = "rope_freqs.weight";

struct Layer<K: Kernels> {
    input_norm: K::Weight,
    q: K::Weight,
    k: K::Weight,
    v: K::Weight,
    q_bias: Option<K::Weight>,
    k_bias: Option<K::Weight>,
    v_bias: Option<K::Weight>,
    o: K::Weight,
    o_bias: Option<K::Weight>,
    post_norm: K::Weight,
    gate: K::Weight,
    up: K::Weight,
    down: K::Weight,
}

/// A loaded model, generic over the kernels backend.
pub struct LlamaModel<K: Kernels> {
    config: ModelConfig,
    embed: K::Weight,
    layers: Vec<Layer<K>>,
    norm: K::Weight,
    /// `None` when tied to `embed`.
    lm_head: Option<K::Weight>,
    inv_freq: Vec<f32>,
    /// Activation buffers reused from step to step.
    scratch: Mutex<Scratch<K>>,
}

impl<K: Kernels> LlamaModel<K> {
    /// Loads every weight `config` calls for from `weights`, checking shapes.
    pub fn load(kernels: &K, config: ModelConfig, weights: &Weights) -> Result<Self> {
        let c = &config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (q_out, kv_out) = (c.num_heads * hd, c.num_kv_heads * hd);
        let get = |name: &str, shape: &[usize]| -> Result<K::Weight> {
            Ok(kernels.upload(&weights.get(name, shape)?))
        };
        let opt = |on: bool, name: &str, shape: &[usize]| -> Result<Option<K::Weight>> {
            if on { get(name, shape).map(Some) } else { Ok(None) }
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = format!("model.layers.{i}");
            layers.push(Layer {
                input_norm: get(&format!("{p}.input_layernorm.weight"), &[h])?,
                q: get(&format!("{p}.self_attn.q_proj.weight"), &[q_out, h])?,
                k: get(&format!("{p}.self_attn.k_proj.weight"), &[kv_out, h])?,
                v: get(&format!("{p}.self_attn.v_proj.weight"), &[kv_out, h])?,
                q_bias: opt(c.qkv_bias, &format!("{p}.self_attn.q_proj.bias"), &[q_out])?,
                k_bias: opt(c.qkv_bias, &format!("{p}.self_attn.k_proj.bias"), &[kv_out])?,
                v_bias: opt(c.qkv_bias, &format!("{p}.self_attn.v_proj.bias"), &[kv_out])?,
                o: get(&format!("{p}.self_attn.o_proj.weight"), &[h, q_out])?,
                o_bias: opt(c.o_bias, &format!("{p}.self_attn.o_proj.bias"), &[h])?,
                post_norm: get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate: get(&format!("{p}.mlp.gate_proj.weight"), &[c.intermediate_size, h])?,
                up: get(&format!("{p}.mlp.up_proj.weight"), &[c.intermediate_size, h])?,
                down: get(&format!("{p}.mlp.down_proj.weight"), &[h, c.intermediate_size])?,
            });
        }
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(get("lm_head.weight", &[c.vocab_size, h])?)
        };
        let mut inv_freq = config.inv_freq();
        // GGUF files of Llama 3.1+ carry llama3 RoPE scaling as per-pair frequency divisors.
        if weights.contains(ROPE_FREQS) {
            let f = weights.get(ROPE_FREQS, &[hd / 2])?;
            inv_freq
                .iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v /= f.data().get(i));
        }
        Ok(Self {
            embed: get("model.embed_tokens.weight", &[c.vocab_size, h])?,
            norm: get("model.norm.weight", &[h])?,
            lm_head,
            layers,
            inv_freq,
            config,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// KV-cache storage for this model: `num_blocks` blocks of `block_size` tokens, f32 elements.
    pub fn new_kv_cache(&self, kernels: &K, num_blocks: usize, block_size: usize) -> KvCache<K> {
        self.new_kv_cache_as(kernels, num_blocks, block_size, KvDType::F32)
    }

    /// [`Self::new_kv_cache`] with elements of `dtype`.
    pub fn new_kv_cache_as(
        &self,
        kernels: &K,
        num_blocks: usize,
        block_size: usize,
        dtype: KvDType,
    ) -> KvCache<K> {
        let layout = KvLayout {
            num_blocks,
            block_size,
            num_kv_heads: self.config.num_kv_heads,
            head_dim: self.config.head_dim,
            dtype,
        };
        KvCache::new(kernels, self.config.num_layers, layout)
    }

    /// Runs one step over `batch`, writing the new tokens' K/V into `cache` and returning the logits
    /// the sequences asked for.
    pub fn forward(&self, kernels: &K, batch: &[SeqInput<'_>], cache: &mut KvCache<K>) -> Result<Logits> {
        self.forward_lora(kernels, batch, &[], cache)
    }

    /// [`Self::forward`] with LoRA adapters: a sequence whose `adapter` is `Some(i)` gets
    /// `adapters[i]`'s deltas on its rows (see `model::lora`).
    pub fn forward_lora(
        &self,
        kernels: &K,
        batch: &[SeqInput<'_>],
        adapters: &[&LoraWeights<K>],
        cache: &mut KvCache<K>,
    ) -> Result<Logits> {
        let plan = self.plan(batch, adapters.len(), &cache.layout)?;
        Ok(kernels.scope(|| self.run(kernels, batch, &plan, adapters, cache)))
    }

    /// Takes back the logits of a step once they have been read, so the next step reuses their memory
    /// (optional: dropping them is correct too).
    pub fn recycle(&self, logits: Logits) {
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        scratch.recycle_host(logits.data);
    }

    /// Frees the activation buffers kept between steps (the next step allocates them again).
    pub fn release_scratch(&self) {
        *self.scratch.lock().unwrap_or_else(|e| e.into_inner()) = Scratch::default();
    }

    /// Flattens and validates the batch (vLLM's `input_ids`, `positions`, `slot_mapping`).
    fn plan(&self, batch: &[SeqInput<'_>], num_adapters: usize, layout: &KvLayout) -> Result<Plan> {
        let c = &self.config;
        let mut plan = Plan::default();
        for (i, s) in batch.iter().enumerate() {
            if let Some(a) = s.adapter.filter(|&a| a >= num_adapters) {
                return Err(EngineError::Batch(format!(
                    "sequence {i} names adapter {a}, but the step has {num_adapters}"
                )));
            }
            let end = s.start_pos + s.tokens.len();
            if s.tokens.is_empty() {
                return Err(EngineError::Batch(format!("sequence {i} has no new tokens")));
            }
            if end > c.max_position_embeddings {
                return Err(EngineError::Batch(format!(
                    "sequence {i} reaches position {end}, past max_position_embeddings ({})",
                    c.max_position_embeddings
                )));
            }
            if s.block_table.len() * layout.block_size < end {
                return Err(EngineError::Batch(format!(
                    "sequence {i}: block table covers fewer than {end} tokens"
                )));
            }
            if let Some(b) = s.block_table.iter().find(|&&b| b as usize >= layout.num_blocks) {
                return Err(EngineError::Batch(format!(
                    "sequence {i}: block {b} outside the KV cache"
                )));
            }
            if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(EngineError::Batch(format!(
                    "sequence {i}: token {t} outside the vocabulary"
                )));
            }
            let first_row = plan.ids.len();
            for (j, &t) in s.tokens.iter().enumerate() {
                plan.ids.push(t);
                plan.positions.push((s.start_pos + j) as u32);
                plan.slots.push(layout.slot_id(s.block_table, s.start_pos + j));
                plan.row_adapter.push(s.adapter);
            }
            let n_out = plan.logit_rows.len();
            match s.logits {
                LogitsRows::None => {}
                LogitsRows::Last => plan.logit_rows.push(plan.ids.len() - 1),
                LogitsRows::All => plan.logit_rows.extend(first_row..plan.ids.len()),
            }
            plan.out_ranges.push(n_out..plan.logit_rows.len());
        }
        Ok(plan)
    }

    fn run(
        &self,
        k: &K,
        batch: &[SeqInput<'_>],
        plan: &Plan,
        adapters: &[&LoraWeights<K>],
        cache: &mut KvCache<K>,
    ) -> Logits {
        let c = &self.config;
        let rows = plan.ids.len();
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (q_w, kv_w) = (c.num_heads * hd, c.num_kv_heads * hd);
        let mut seqs = Vec::with_capacity(batch.len());
        let mut row = 0;
        for s in batch {
            seqs.push(AttnSeq {
                row_start: row,
                num_rows: s.tokens.len(),
                first_pos: s.start_pos,
                block_table: s.block_table,
            });
            row += s.tokens.len();
        }
        let heads = AttnHeads {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let inter = c.intermediate_size;
        let need = super::scratch::row_widths(c).map(|w| rows * w);
        let [
            mut x,
            mut xn,
            mut q,
            mut kk,
            mut vv,
            mut attn,
            mut proj,
            mut gate,
            mut up,
            mut act,
        ] = std::array::from_fn(|i| scratch.take(k, i, need[i]));
        let mut lora = LoraPlan::new(k, adapters, &plan.row_adapter, h.max(q_w).max(inter));
        // Adds the LoRA deltas of `target` (input `x`, `in_w` wide) to `out` (`out_w` wide).
        let mut delta = |l: usize, t: Target, x: &K::Buf, in_w: usize, out: &mut K::Buf, out_w: usize| {
            if !lora.is_empty() {
                lora.apply(k, (l, t), (x, in_w), (out, out_w));
            }
        };
        k.embedding(&self.embed, &plan.ids, &mut x);
        for (l, layer) in self.layers.iter().enumerate() {
            k.rms_norm(&x, rows, &layer.input_norm, c.rms_norm_eps, &mut xn);
            k.matmul(&xn, rows, &layer.q, layer.q_bias.as_ref(), &mut q);
            delta(l, Target::Q, &xn, h, &mut q, q_w);
            k.matmul(&xn, rows, &layer.k, layer.k_bias.as_ref(), &mut kk);
            delta(l, Target::K, &xn, h, &mut kk, kv_w);
            k.matmul(&xn, rows, &layer.v, layer.v_bias.as_ref(), &mut vv);
            delta(l, Target::V, &xn, h, &mut vv, kv_w);
            let rope = Rope {
                inv_freq: &self.inv_freq,
                interleaved: c.rope_interleaved,
            };
            k.rope(&mut q, c.num_heads, hd, &plan.positions, rope);
            k.rope(&mut kk, c.num_kv_heads, hd, &plan.positions, rope);
            k.write_kv(
                &kk,
                &vv,
                &plan.slots,
                &cache.layout,
                &mut cache.k[l],
                &mut cache.v[l],
            );
            k.paged_attention(
                &q,
                &seqs,
                heads,
                &cache.layout,
                (&cache.k[l], &cache.v[l]),
                &mut attn,
            );
            k.matmul(&attn, rows, &layer.o, layer.o_bias.as_ref(), &mut proj);
            delta(l, Target::O, &attn, q_w, &mut proj, h);
            k.add_assign(&mut x, &proj, rows * h);
            k.rms_norm(&x, rows, &layer.post_norm, c.rms_norm_eps, &mut xn);
            k.matmul(&xn, rows, &layer.gate, None, &mut gate);
            delta(l, Target::Gate, &xn, h, &mut gate, inter);
            k.matmul(&xn, rows, &layer.up, None, &mut up);
            delta(l, Target::Up, &xn, h, &mut up, inter);
            k.silu_mul(&gate, &up, &mut act, rows * inter);
            k.matmul(&act, rows, &layer.down, None, &mut proj);
            delta(l, Target::Down, &act, inter, &mut proj, h);
            k.add_assign(&mut x, &proj, rows * h);
        }
        let n_out = plan.logit_rows.len();
        let vocab = c.vocab_size;
        let mut data = scratch.host(n_out * vocab);
        if n_out > 0 {
            let mut sel = scratch.take(k, 10, n_out * h);
            k.gather_rows(&x, h, &plan.logit_rows, &mut sel);
            let mut seln = scratch.take(k, 11, n_out * h);
            k.rms_norm(&sel, n_out, &self.norm, c.rms_norm_eps, &mut seln);
            let mut logits = scratch.take(k, 12, n_out * vocab);
            k.matmul(
                &seln,
                n_out,
                self.lm_head.as_ref().unwrap_or(&self.embed),
                None,
                &mut logits,
            );
            k.read(&logits, &mut data);
            for (i, b) in [sel, seln, logits].into_iter().enumerate() {
                scratch.put(10 + i, b);
            }
        }
        for (i, b) in [x, xn, q, kk, vv, attn, proj, gate, up, act]
            .into_iter()
            .enumerate()
        {
            scratch.put(i, b);
        }
        Logits {
            vocab_size: vocab,
            data,
            rows: plan.out_ranges.clone(),
        }
    }
}

/// The flattened batch.
#[derive(Default)]
struct Plan {
    ids: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<u32>,
    /// Per row, its sequence's adapter index.
    row_adapter: Vec<Option<usize>>,
    /// Batch rows whose logits are returned, in order.
    logit_rows: Vec<usize>,
    /// Per sequence, its range in `logit_rows`.
    out_ranges: Vec<std::ops::Range<usize>>,
}
