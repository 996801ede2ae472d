//! [`Decoder::load`]: every weight the config calls for, by its Hugging Face name (GGUF files are
//! mapped to those names by `gguf_model`), checked against the shape the config implies and uploaded
//! to the kernels backend.
//!
//! Invariants: a family's feature fields decide which tensors are read (biases, q/k norms, sandwich
//! norms, experts), so a missing or misshapen tensor is an error naming it, never a default; fused
//! projections (Phi-3's `qkv_proj`, `gate_up_proj`) become row views of the one stored tensor, no copy;
//! RMSNorm weights stored as offsets from 1 (Gemma in safetensors) get the 1 added here, once.

use super::config::ModelConfig;
use super::decoder::{Attention, Decoder, Ffn, Layer};
use super::moe::{Expert, MoeFfn};
use super::scratch::Scratch;
use super::weights::Weights;
use crate::error::{EngineError, Result};
use crate::kv::KvGroups;
use modelfleet_kernels::{HostWeight, Kernels};
use std::sync::Mutex;

/// Per-pair RoPE frequency divisors (GGUF, llama3 scaling).
const ROPE_FREQS: &str = "rope_freqs.weight";

/// Reads weights of one model onto one backend.
struct Loader<'a, K: Kernels> {
    k: &'a K,
    w: &'a Weights,
    c: &'a ModelConfig,
}

impl<K: Kernels> Loader<'_, K> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<K::Weight> {
        Ok(self.k.upload(&self.w.get(name, shape)?))
    }

    fn opt(&self, on: bool, name: &str, shape: &[usize]) -> Result<Option<K::Weight>> {
        if on {
            self.get(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An RMSNorm weight, with Gemma's `1 + w` applied when stored as offsets.
    fn norm(&self, name: &str, n: usize) -> Result<K::Weight> {
        let w = self.w.get(name, &[n])?;
        if !self.c.norm_weight_offset {
            return Ok(self.k.upload(&w));
        }
        let mut v = vec![0.0f32; n];
        w.data().copy_to_f32(0, &mut v);
        v.iter_mut().for_each(|x| *x += 1.0);
        let w = HostWeight::from_f32(&v, 1, n).map_err(|e| EngineError::Weights {
            path: name.into(),
            tensor: name.into(),
            message: e.to_string(),
        })?;
        Ok(self.k.upload(&w))
    }

    fn opt_norm(&self, on: bool, name: &str, n: usize) -> Result<Option<K::Weight>> {
        if on {
            self.norm(name, n).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The projections `parts` (name, rows; `cols` columns each): row blocks of the fused tensor
    /// `fused` when the model stores them fused, else each by its own name.
    fn split_or_get<const N: usize>(
        &self,
        fused: &str,
        parts: [(String, usize); N],
        cols: usize,
    ) -> Result<[K::Weight; N]> {
        let host = if self.w.contains(fused) {
            let rows: Vec<usize> = parts.iter().map(|p| p.1).collect();
            self.w.get_row_split(fused, &rows, cols)?
        } else {
            parts
                .iter()
                .map(|(name, rows)| self.w.get(name, &[*rows, cols]))
                .collect::<Result<Vec<_>>>()?
        };
        let uploaded: Vec<K::Weight> = host.iter().map(|w| self.k.upload(w)).collect();
        Ok(uploaded
            .try_into()
            .unwrap_or_else(|_| unreachable!("one weight per part")))
    }

    fn attention(&self, l: usize) -> Result<Attention<K>> {
        let c = self.c;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (q_out, kv_out) = (c.num_heads * hd, c.num_kv_heads * hd);
        let a = format!("model.layers.{l}.self_attn");
        let [q, k, v] = self.split_or_get(
            &format!("{a}.qkv_proj.weight"),
            [
                (format!("{a}.q_proj.weight"), q_out),
                (format!("{a}.k_proj.weight"), kv_out),
                (format!("{a}.v_proj.weight"), kv_out),
            ],
            h,
        )?;
        Ok(Attention {
            q,
            k,
            v,
            q_bias: self.opt(c.qkv_bias, &format!("{a}.q_proj.bias"), &[q_out])?,
            k_bias: self.opt(c.qkv_bias, &format!("{a}.k_proj.bias"), &[kv_out])?,
            v_bias: self.opt(c.qkv_bias, &format!("{a}.v_proj.bias"), &[kv_out])?,
            o: self.get(&format!("{a}.o_proj.weight"), &[h, q_out])?,
            o_bias: self.opt(c.o_bias, &format!("{a}.o_proj.bias"), &[h])?,
            q_norm: self.opt_norm(c.qk_norm, &format!("{a}.q_norm.weight"), hd)?,
            k_norm: self.opt_norm(c.qk_norm, &format!("{a}.k_norm.weight"), hd)?,
            local: c.is_local(l),
        })
    }

    fn ffn(&self, l: usize) -> Result<Ffn<K>> {
        let (h, inter) = (self.c.hidden_size, self.c.intermediate_size);
        if self.c.is_moe(l) {
            return self.moe(l).map(Ffn::Moe);
        }
        let p = format!("model.layers.{l}.mlp");
        let [gate, up] = self.split_or_get(
            &format!("{p}.gate_up_proj.weight"),
            [
                (format!("{p}.gate_proj.weight"), inter),
                (format!("{p}.up_proj.weight"), inter),
            ],
            h,
        )?;
        Ok(Ffn::Dense {
            gate,
            up,
            down: self.get(&format!("{p}.down_proj.weight"), &[h, inter])?,
        })
    }

    fn moe(&self, l: usize) -> Result<MoeFfn<K>> {
        let c = self.c;
        let m = c.moe.as_ref().expect("a MoE layer has a MoE config");
        let (h, ff, n) = (c.hidden_size, m.expert_ff, m.num_experts);
        let p = format!("model.layers.{l}.mlp");
        let proj = |name: &str, rows: usize, cols: usize| {
            let per = |e: usize| format!("{p}.experts.{e}.{name}.weight");
            self.w
                .get_experts(&format!("{p}.experts.{name}.weight"), per, n, rows, cols)
        };
        let (gates, ups, downs) = (
            proj("gate_proj", ff, h)?,
            proj("up_proj", ff, h)?,
            proj("down_proj", h, ff)?,
        );
        let experts = gates
            .iter()
            .zip(&ups)
            .zip(&downs)
            .map(|((g, u), d)| Expert {
                gate: self.k.upload(g),
                up: self.k.upload(u),
                down: self.k.upload(d),
            })
            .collect();
        Ok(MoeFfn {
            router: self.get(&format!("{p}.gate.weight"), &[n, h])?,
            experts,
        })
    }

    fn layer(&self, l: usize) -> Result<Layer<K>> {
        let (h, sandwich) = (self.c.hidden_size, self.c.sandwich_norms);
        let p = format!("model.layers.{l}");
        // With sandwich norms, the FFN's input norm is `pre_feedforward_layernorm`.
        let ffn_norm = if sandwich {
            "pre_feedforward_layernorm"
        } else {
            "post_attention_layernorm"
        };
        Ok(Layer {
            attn_norm: self.norm(&format!("{p}.input_layernorm.weight"), h)?,
            attn: self.attention(l)?,
            post_attn_norm: self.opt_norm(sandwich, &format!("{p}.post_attention_layernorm.weight"), h)?,
            ffn_norm: self.norm(&format!("{p}.{ffn_norm}.weight"), h)?,
            ffn: self.ffn(l)?,
            post_ffn_norm: self.opt_norm(sandwich, &format!("{p}.post_feedforward_layernorm.weight"), h)?,
        })
    }

    /// The global layers' RoPE frequencies (GGUF files of Llama 3.1+ carry llama3 scaling as per-pair
    /// divisors) and the local layers'.
    fn rope(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        let c = self.c;
        let mut inv_freq = c.inv_freq();
        if self.w.contains(ROPE_FREQS) {
            let f = self.w.get(ROPE_FREQS, &[c.rotary_dim / 2])?;
            inv_freq
                .iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v /= f.data().get(i));
        }
        let local = match c.rope_local_theta {
            Some(_) => c.inv_freq_local(),
            None => inv_freq.clone(),
        };
        Ok((inv_freq, local))
    }
}

impl<K: Kernels> Decoder<K> {
    /// Loads every weight `config` calls for from `weights`, checking shapes.
    pub fn load(kernels: &K, config: ModelConfig, weights: &Weights) -> Result<Self> {
        let ld = Loader {
            k: kernels,
            w: weights,
            c: &config,
        };
        let (h, vocab) = (config.hidden_size, config.vocab_size);
        let layers = (0..config.num_layers)
            .map(|l| ld.layer(l))
            .collect::<Result<Vec<_>>>()?;
        let lm_head = ld.opt(!config.tie_word_embeddings, "lm_head.weight", &[vocab, h])?;
        let (inv_freq, inv_freq_local) = ld.rope()?;
        let (embed, norm) = (
            ld.get("model.embed_tokens.weight", &[vocab, h])?,
            ld.norm("model.norm.weight", h)?,
        );
        Ok(Self {
            embed,
            norm,
            lm_head,
            layers,
            inv_freq,
            inv_freq_local,
            kv_groups: KvGroups::new(&config.layer_windows(config.serving_context)),
            config,
            scratch: Mutex::new(Scratch::default()),
        })
    }
}
