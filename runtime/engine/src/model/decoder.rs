//! The decoder every family runs, over a ragged batch with a paged KV cache.
//!
//! Per layer: RMSNorm → q/k/v projections (+bias) → [per-head q/k RMSNorm] → RoPE (the layer's: local
//! or global) → store K/V at the batch's slots → paged attention (GQA; a sliding window on local
//! layers) → output projection → [RMSNorm] → residual; RMSNorm → gated FFN (SwiGLU or GeGLU) or a
//! mixture of SwiGLU experts (`model::moe`) → [RMSNorm] → residual. Then the final norm and LM head on
//! the rows that asked for logits only, and a softcap if the family has one. The bracketed steps, the
//! activation, the FFN kind, the window and the RoPE bases are the family's, fixed at load from
//! [`ModelConfig`] (`model::family` decides them); this file never asks which family it runs.
//!
//! LoRA adapters add their deltas per row group right after each targeted projection (`model::lora`).
//!
//! Invariants: each weight is applied once per step to all rows of the batch (one matmul, never a loop
//! of mat-vecs); every kernel is batch-invariant, so a sequence's logits do not depend on what else is
//! in the batch (tested in `tests/forward.rs`); a malformed batch (token out of vocabulary, block
//! table too short, position past the context) is an error, not a panic.
//!
//! Design follows `transformers`' modeling files for the math and vLLM's model runner for the
//! flattened batch (`positions`, `slot_mapping`, per-sequence query ranges).

use super::batch::{Logits, LogitsRows, SeqInput};
use super::config::{Activation, ModelConfig};
use super::lora::{LoraPlan, LoraWeights};
use super::moe::{MoeBufs, MoeFfn};
use super::scratch::{Scratch, Slot};
use crate::error::{EngineError, Result};
use crate::kv::{KvCache, KvGroups, NULL_BLOCK, first_visible_block};
use crate::lora::Target;
use modelfleet_kernels::{AttnHeads, AttnSeq, Kernels, KvDType, KvLayout, Rope};
use std::sync::Mutex;

pub(super) struct Attention<K: Kernels> {
    pub(super) q: K::Weight,
    pub(super) k: K::Weight,
    pub(super) v: K::Weight,
    pub(super) q_bias: Option<K::Weight>,
    pub(super) k_bias: Option<K::Weight>,
    pub(super) v_bias: Option<K::Weight>,
    pub(super) o: K::Weight,
    pub(super) o_bias: Option<K::Weight>,
    /// Per-head RMSNorm weights (`[head_dim]`).
    pub(super) q_norm: Option<K::Weight>,
    pub(super) k_norm: Option<K::Weight>,
    /// A local layer: sliding window and the local RoPE.
    pub(super) local: bool,
}

pub(super) enum Ffn<K: Kernels> {
    /// A gated FFN (SwiGLU or GeGLU).
    Dense {
        gate: K::Weight,
        up: K::Weight,
        down: K::Weight,
    },
    /// A mixture of experts (`model::moe`).
    Moe(MoeFfn<K>),
}

pub(super) struct Layer<K: Kernels> {
    pub(super) attn_norm: K::Weight,
    pub(super) attn: Attention<K>,
    /// Sandwich norm of the attention output.
    pub(super) post_attn_norm: Option<K::Weight>,
    pub(super) ffn_norm: K::Weight,
    pub(super) ffn: Ffn<K>,
    /// Sandwich norm of the FFN output.
    pub(super) post_ffn_norm: Option<K::Weight>,
}

/// A loaded model, generic over the kernels backend.
pub struct Decoder<K: Kernels> {
    pub(super) config: ModelConfig,
    pub(super) embed: K::Weight,
    pub(super) layers: Vec<Layer<K>>,
    pub(super) norm: K::Weight,
    /// `None` when tied to `embed`.
    pub(super) lm_head: Option<K::Weight>,
    pub(super) inv_freq: Vec<f32>,
    pub(super) inv_freq_local: Vec<f32>,
    /// How the layers share the KV cache's blocks.
    pub(super) kv_groups: KvGroups,
    /// Activation buffers reused from step to step.
    pub(super) scratch: Mutex<Scratch<K>>,
}

/// The step's activation buffers (see `scratch::Slot`).
struct Bufs<K: Kernels> {
    x: K::Buf,
    xn: K::Buf,
    q: K::Buf,
    k: K::Buf,
    v: K::Buf,
    qn: K::Buf,
    kn: K::Buf,
    attn: K::Buf,
    proj: K::Buf,
    gate: K::Buf,
    up: K::Buf,
    act: K::Buf,
    router: K::Buf,
    expert_in: K::Buf,
    expert_out: K::Buf,
}

impl<K: Kernels> Bufs<K> {
    /// The buffers of a step of `rows` rows, from `scratch`.
    fn take(scratch: &mut Scratch<K>, k: &K, c: &ModelConfig, rows: usize) -> Self {
        let need = super::scratch::row_widths(c).map(|w| rows * w);
        let mut take = |s: Slot| scratch.take(k, s as usize, need[s as usize]);
        Bufs {
            x: take(Slot::X),
            xn: take(Slot::Xn),
            q: take(Slot::Q),
            k: take(Slot::K),
            v: take(Slot::V),
            qn: take(Slot::Qn),
            kn: take(Slot::Kn),
            attn: take(Slot::Attn),
            proj: take(Slot::Proj),
            gate: take(Slot::Gate),
            up: take(Slot::Up),
            act: take(Slot::Act),
            router: take(Slot::Router),
            expert_in: take(Slot::ExpertIn),
            expert_out: take(Slot::ExpertOut),
        }
    }

    /// Gives every buffer back to its slot.
    fn put_back(self, scratch: &mut Scratch<K>) {
        let Bufs {
            x,
            xn,
            q,
            k,
            v,
            qn,
            kn,
            attn,
            proj,
            gate,
            up,
            act,
            router,
            expert_in,
            expert_out,
        } = self;
        let bufs = [
            x, xn, q, k, v, qn, kn, attn, proj, gate, up, act, router, expert_in, expert_out,
        ];
        let slots = [
            Slot::X,
            Slot::Xn,
            Slot::Q,
            Slot::K,
            Slot::V,
            Slot::Qn,
            Slot::Kn,
            Slot::Attn,
            Slot::Proj,
            Slot::Gate,
            Slot::Up,
            Slot::Act,
            Slot::Router,
            Slot::ExpertIn,
            Slot::ExpertOut,
        ];
        for (s, buf) in slots.into_iter().zip(bufs) {
            scratch.put(s as usize, buf);
        }
    }
}

/// What every layer of a step shares.
struct Step<'a, 'b, K: Kernels> {
    k: &'a K,
    rows: usize,
    plan: &'a Plan,
    /// Per KV-cache group, the sequences as attention sees them.
    seqs: &'a [Vec<AttnSeq<'b>>],
    lora: LoraPlan<'a, K>,
}

impl<K: Kernels> Step<'_, '_, K> {
    /// Adds the LoRA deltas of `target` (input `x`, `in_w` wide) to `out` (`out_w` wide).
    fn delta(&mut self, l: usize, t: Target, x: &K::Buf, in_w: usize, out: &mut K::Buf, out_w: usize) {
        if !self.lora.is_empty() {
            self.lora.apply(self.k, (l, t), (x, in_w), (out, out_w));
        }
    }
}

impl<K: Kernels> Decoder<K> {
    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The model's KV-cache groups: a block table each per sequence ([`SeqInput::block_tables`]).
    pub fn kv_groups(&self) -> &KvGroups {
        &self.kv_groups
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
        KvCache::new(kernels, self.kv_groups.width(), layout)
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
        let mut plan = Plan {
            slots: vec![Vec::new(); self.kv_groups.len()],
            ..Plan::default()
        };
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
            self.check_tables(i, s, layout)?;
            if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(EngineError::Batch(format!(
                    "sequence {i}: token {t} outside the vocabulary"
                )));
            }
            let first_row = plan.ids.len();
            for (j, &t) in s.tokens.iter().enumerate() {
                plan.ids.push(t);
                plan.positions.push((s.start_pos + j) as u32);
                for (g, table) in s.block_tables.iter().enumerate() {
                    plan.slots[g].push(layout.slot_id(table, s.start_pos + j));
                }
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
}

impl<K: Kernels> Decoder<K> {
    /// Sequence `i`'s block tables: one per group, each covering its new tokens, with a real block
    /// wherever a new token's query looks (a window group's older entries may be [`NULL_BLOCK`]).
    fn check_tables(&self, i: usize, s: &SeqInput<'_>, layout: &KvLayout) -> Result<()> {
        let groups = self.kv_groups.len();
        if s.block_tables.len() != groups {
            return Err(EngineError::Batch(format!(
                "sequence {i} has {} block tables, the model {groups} KV-cache groups",
                s.block_tables.len()
            )));
        }
        let end = s.start_pos + s.tokens.len();
        for (g, (table, w)) in s.block_tables.iter().zip(self.kv_groups.windows()).enumerate() {
            if table.len() * layout.block_size < end {
                return Err(EngineError::Batch(format!(
                    "sequence {i}: block table {g} covers fewer than {end} tokens"
                )));
            }
            let seen = w.map_or(0, |w| first_visible_block(s.start_pos, w, layout.block_size));
            let last = end.div_ceil(layout.block_size);
            if let Some(b) = table[seen..last]
                .iter()
                .find(|&&b| b as usize >= layout.num_blocks)
            {
                let what = if *b == NULL_BLOCK {
                    "given back".to_owned()
                } else {
                    format!("{b}, outside the KV cache")
                };
                return Err(EngineError::Batch(format!(
                    "sequence {i}: block table {g} holds a block the step reads that is {what}"
                )));
            }
        }
        Ok(())
    }
}

impl<K: Kernels> Decoder<K> {
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
        let h = c.hidden_size;
        // Per group, the batch as its layers' attention sees it.
        let seqs: Vec<Vec<AttnSeq<'_>>> = (0..self.kv_groups.len())
            .map(|g| {
                let mut row = 0;
                batch
                    .iter()
                    .map(|s| {
                        let seq = AttnSeq {
                            row_start: row,
                            num_rows: s.tokens.len(),
                            first_pos: s.start_pos,
                            block_table: &s.block_tables[g],
                        };
                        row += s.tokens.len();
                        seq
                    })
                    .collect()
            })
            .collect();
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let mut b = Bufs::take(&mut scratch, k, c, rows);
        let widest = h.max(c.num_heads * c.head_dim).max(c.ffn_width());
        let mut step = Step {
            k,
            rows,
            plan,
            seqs: &seqs,
            lora: LoraPlan::new(k, adapters, &plan.row_adapter, widest),
        };
        k.embedding(&self.embed, &plan.ids, &mut b.x);
        if let Some(s) = c.embed_scale {
            k.scale(&mut b.x, rows * h, s);
        }
        for (l, layer) in self.layers.iter().enumerate() {
            k.rms_norm(&b.x, rows, &layer.attn_norm, c.rms_norm_eps, &mut b.xn);
            self.attention(&mut step, l, &layer.attn, &mut b, cache);
            self.residual(k, rows, layer.post_attn_norm.as_ref(), &mut b);
            k.rms_norm(&b.x, rows, &layer.ffn_norm, c.rms_norm_eps, &mut b.xn);
            self.ffn(&mut step, l, &layer.ffn, &mut b);
            self.residual(k, rows, layer.post_ffn_norm.as_ref(), &mut b);
        }
        let data = self.logits(k, &mut scratch, plan, &b.x);
        b.put_back(&mut scratch);
        Logits {
            vocab_size: c.vocab_size,
            data,
            rows: plan.out_ranges.clone(),
        }
    }

    /// Layer `l`'s attention on `b.xn` into `b.proj` (after the output projection).
    fn attention(
        &self,
        st: &mut Step<'_, '_, K>,
        l: usize,
        a: &Attention<K>,
        b: &mut Bufs<K>,
        cache: &mut KvCache<K>,
    ) {
        let (c, k, rows) = (&self.config, st.k, st.rows);
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (q_w, kv_w) = (c.num_heads * hd, c.num_kv_heads * hd);
        k.matmul(&b.xn, rows, &a.q, a.q_bias.as_ref(), &mut b.q);
        st.delta(l, Target::Q, &b.xn, h, &mut b.q, q_w);
        k.matmul(&b.xn, rows, &a.k, a.k_bias.as_ref(), &mut b.k);
        st.delta(l, Target::K, &b.xn, h, &mut b.k, kv_w);
        k.matmul(&b.xn, rows, &a.v, a.v_bias.as_ref(), &mut b.v);
        st.delta(l, Target::V, &b.xn, h, &mut b.v, kv_w);
        // Per-head norms write into `qn`/`kn`, which then stand for the queries and keys.
        let q = match &a.q_norm {
            Some(w) => {
                k.rms_norm(&b.q, rows * c.num_heads, w, c.rms_norm_eps, &mut b.qn);
                &mut b.qn
            }
            None => &mut b.q,
        };
        let kk = match &a.k_norm {
            Some(w) => {
                k.rms_norm(&b.k, rows * c.num_kv_heads, w, c.rms_norm_eps, &mut b.kn);
                &mut b.kn
            }
            None => &mut b.k,
        };
        let rope = Rope {
            inv_freq: if a.local {
                &self.inv_freq_local
            } else {
                &self.inv_freq
            },
            interleaved: c.rope_interleaved,
            scale: c.rope_scale(),
        };
        let positions = &st.plan.positions;
        k.rope(q, c.num_heads, hd, positions, rope);
        k.rope(kk, c.num_kv_heads, hd, positions, rope);
        let (g, j) = self.kv_groups.layer(l);
        k.write_kv(
            kk,
            &b.v,
            &st.plan.slots[g],
            &cache.layout,
            &mut cache.k[j],
            &mut cache.v[j],
        );
        let heads = AttnHeads {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: hd,
            scale: c.attn_scale,
            window: if a.local { c.sliding_window } else { None },
        };
        let caches = (&cache.k[j], &cache.v[j]);
        k.paged_attention(q, &st.seqs[g], heads, &cache.layout, caches, &mut b.attn);
        k.matmul(&b.attn, rows, &a.o, a.o_bias.as_ref(), &mut b.proj);
        st.delta(l, Target::O, &b.attn, q_w, &mut b.proj, h);
    }

    /// Layer `l`'s FFN on `b.xn` into `b.proj`.
    fn ffn(&self, st: &mut Step<'_, '_, K>, l: usize, f: &Ffn<K>, b: &mut Bufs<K>) {
        let (c, k, rows) = (&self.config, st.k, st.rows);
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let (gate, up, down) = match f {
            Ffn::Dense { gate, up, down } => (gate, up, down),
            Ffn::Moe(moe) => {
                // LoRA on MoE layers' FFN is refused when an adapter loads (`lora::LoraAdapter::load`).
                let m = c.moe.as_ref().expect("a MoE layer has a MoE config");
                let bufs = MoeBufs {
                    xn: &b.xn,
                    router: &mut b.router,
                    expert_in: &mut b.expert_in,
                    expert_out: &mut b.expert_out,
                    gate: &mut b.gate,
                    up: &mut b.up,
                    act: &mut b.act,
                    out: &mut b.proj,
                };
                moe.forward(k, rows, (h, m.expert_ff), (m.top_k, m.norm_topk_prob), bufs);
                return;
            }
        };
        k.matmul(&b.xn, rows, gate, None, &mut b.gate);
        st.delta(l, Target::Gate, &b.xn, h, &mut b.gate, inter);
        k.matmul(&b.xn, rows, up, None, &mut b.up);
        st.delta(l, Target::Up, &b.xn, h, &mut b.up, inter);
        match c.activation {
            Activation::Silu => k.silu_mul(&b.gate, &b.up, &mut b.act, rows * inter),
            Activation::GeluTanh => k.gelu_mul(&b.gate, &b.up, &mut b.act, rows * inter),
        }
        k.matmul(&b.act, rows, down, None, &mut b.proj);
        st.delta(l, Target::Down, &b.act, inter, &mut b.proj, h);
    }

    /// `x += proj`, through the sandwich norm `post` when the family has one (`xn` is free by then).
    fn residual(&self, k: &K, rows: usize, post: Option<&K::Weight>, b: &mut Bufs<K>) {
        let c = &self.config;
        match post {
            Some(w) => {
                k.rms_norm(&b.proj, rows, w, c.rms_norm_eps, &mut b.xn);
                k.add_assign(&mut b.x, &b.xn, rows * c.hidden_size);
            }
            None => k.add_assign(&mut b.x, &b.proj, rows * c.hidden_size),
        }
    }

    /// The final norm, LM head and softcap on the rows that asked for logits, copied to the host.
    fn logits(&self, k: &K, scratch: &mut Scratch<K>, plan: &Plan, x: &K::Buf) -> Vec<f32> {
        let c = &self.config;
        let (h, vocab, n_out) = (c.hidden_size, c.vocab_size, plan.logit_rows.len());
        let mut data = scratch.host(n_out * vocab);
        if n_out == 0 {
            return data;
        }
        let mut sel = scratch.take(k, Slot::Sel as usize, n_out * h);
        k.gather_rows(x, h, &plan.logit_rows, &mut sel);
        let mut seln = scratch.take(k, Slot::SelNorm as usize, n_out * h);
        k.rms_norm(&sel, n_out, &self.norm, c.rms_norm_eps, &mut seln);
        let mut logits = scratch.take(k, Slot::Logits as usize, n_out * vocab);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        k.matmul(&seln, n_out, head, None, &mut logits);
        k.read(&logits, &mut data);
        if let Some(cap) = c.final_logit_softcap {
            data.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        }
        for (s, buf) in [(Slot::Sel, sel), (Slot::SelNorm, seln), (Slot::Logits, logits)] {
            scratch.put(s as usize, buf);
        }
        data
    }
}

/// Layer `l`'s router and experts (safetensors: one tensor per expert; GGUF: one stacked tensor per
/// projection).
/// The flattened batch.
#[derive(Default)]
struct Plan {
    ids: Vec<u32>,
    positions: Vec<u32>,
    /// Per KV-cache group, each row's slot.
    slots: Vec<Vec<u32>>,
    /// Per row, its sequence's adapter index.
    row_adapter: Vec<Option<usize>>,
    /// Batch rows whose logits are returned, in order.
    logit_rows: Vec<usize>,
    /// Per sequence, its range in `logit_rows`.
    out_ranges: Vec<std::ops::Range<usize>>,
}
