//! The BERT encoder on the kernels: token + position + type embeddings, LayerNorm, then per layer
//! bidirectional self-attention (biased Q/K/V/O projections) and a GELU FFN, each followed by a
//! residual add and a LayerNorm (post-norm). One forward pass takes a ragged batch — the inputs' rows
//! back to back, no padding — and returns every row's final state.
//!
//! Invariants: an input's rows depend on that input only (matmuls and norms are row-wise and
//! batch-invariant, attention stays within each input), so its embedding is bit-identical alone or in
//! any batch; tensors are read by their Hugging Face names, with or without the `bert.` prefix of
//! `BertForMaskedLM` checkpoints, and LayerNorm's `weight`/`bias` or the old `gamma`/`beta`.

use super::config::EncoderConfig;
use crate::error::{EngineError, Result};
use crate::model::Weights;
use modelfleet_kernels::{AttnHeads, Kernels};

struct Layer<K: Kernels> {
    q: (K::Weight, K::Weight),
    k: (K::Weight, K::Weight),
    v: (K::Weight, K::Weight),
    o: (K::Weight, K::Weight),
    attn_norm: (K::Weight, K::Weight),
    up: (K::Weight, K::Weight),
    down: (K::Weight, K::Weight),
    ffn_norm: (K::Weight, K::Weight),
}

/// A loaded encoder.
pub struct Encoder<K: Kernels> {
    c: EncoderConfig,
    word: K::Weight,
    position: K::Weight,
    token_type: K::Weight,
    emb_norm: (K::Weight, K::Weight),
    layers: Vec<Layer<K>>,
}

struct Loader<'a, K: Kernels> {
    k: &'a K,
    w: &'a Weights,
    prefix: &'static str,
}

impl<K: Kernels> Loader<'_, K> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<K::Weight> {
        Ok(self
            .k
            .upload(&self.w.get(&format!("{}{name}", self.prefix), shape)?))
    }

    /// A dense layer's weight and bias.
    fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<(K::Weight, K::Weight)> {
        Ok((
            self.get(&format!("{name}.weight"), &[rows, cols])?,
            self.get(&format!("{name}.bias"), &[rows])?,
        ))
    }

    /// A LayerNorm's weight and bias (`gamma`/`beta` in old checkpoints).
    fn norm(&self, name: &str, n: usize) -> Result<(K::Weight, K::Weight)> {
        let old = self.w.contains(&format!("{}{name}.gamma", self.prefix));
        let (w, b) = if old {
            ("gamma", "beta")
        } else {
            ("weight", "bias")
        };
        Ok((
            self.get(&format!("{name}.{w}"), &[n])?,
            self.get(&format!("{name}.{b}"), &[n])?,
        ))
    }
}

impl<K: Kernels> Encoder<K> {
    /// Reads every weight `c` calls for from `w` onto `k`.
    pub fn load(c: &EncoderConfig, w: &Weights, k: &K) -> Result<Self> {
        let prefix = if w.contains("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let l = Loader { k, w, prefix };
        let (h, ff) = (c.hidden_size, c.intermediate_size);
        let layers = (0..c.num_layers)
            .map(|i| {
                let p = format!("encoder.layer.{i}");
                Ok(Layer {
                    q: l.linear(&format!("{p}.attention.self.query"), h, h)?,
                    k: l.linear(&format!("{p}.attention.self.key"), h, h)?,
                    v: l.linear(&format!("{p}.attention.self.value"), h, h)?,
                    o: l.linear(&format!("{p}.attention.output.dense"), h, h)?,
                    attn_norm: l.norm(&format!("{p}.attention.output.LayerNorm"), h)?,
                    up: l.linear(&format!("{p}.intermediate.dense"), ff, h)?,
                    down: l.linear(&format!("{p}.output.dense"), h, ff)?,
                    ffn_norm: l.norm(&format!("{p}.output.LayerNorm"), h)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            word: l.get("embeddings.word_embeddings.weight", &[c.vocab_size, h])?,
            position: l.get(
                "embeddings.position_embeddings.weight",
                &[c.max_position_embeddings, h],
            )?,
            token_type: l.get("embeddings.token_type_embeddings.weight", &[c.type_vocab_size, h])?,
            emb_norm: l.norm("embeddings.LayerNorm", h)?,
            layers,
            c: c.clone(),
        })
    }

    /// The encoder's shape.
    pub fn config(&self) -> &EncoderConfig {
        &self.c
    }

    /// Every row's final state for the inputs `inputs` (each at least one token, at most
    /// `max_position_embeddings`, every id below `vocab_size`), back to back: `Σ len × hidden_size`.
    pub fn forward(&self, k: &K, inputs: &[&[u32]]) -> Result<Vec<f32>> {
        let c = &self.c;
        let h = c.hidden_size;
        for (i, ids) in inputs.iter().enumerate() {
            if ids.is_empty() || ids.len() > c.max_position_embeddings {
                return Err(EngineError::InvalidParam {
                    field: "input",
                    message: format!(
                        "item {i} has {} tokens; each must have 1 to {}",
                        ids.len(),
                        c.max_position_embeddings
                    ),
                });
            }
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(EngineError::InvalidParam {
                    field: "input",
                    message: format!(
                        "item {i}: token id {bad} is not below the vocabulary size {}",
                        c.vocab_size
                    ),
                });
            }
        }
        let ids: Vec<u32> = inputs.iter().flat_map(|s| s.iter().copied()).collect();
        let positions: Vec<u32> = inputs.iter().flat_map(|s| 0..s.len() as u32).collect();
        let mut seqs = Vec::with_capacity(inputs.len());
        let mut start = 0;
        for s in inputs {
            seqs.push((start, s.len()));
            start += s.len();
        }
        let rows = ids.len();
        Ok(k.scope(|| self.run(k, &ids, &positions, &seqs, rows, h)))
    }

    fn run(
        &self,
        k: &K,
        ids: &[u32],
        positions: &[u32],
        seqs: &[(usize, usize)],
        rows: usize,
        h: usize,
    ) -> Vec<f32> {
        let c = &self.c;
        let n = rows * h;
        let (mut x, mut t) = (k.alloc(n), k.alloc(n));
        k.embedding(&self.word, ids, &mut x);
        k.embedding(&self.position, positions, &mut t);
        k.add_assign(&mut x, &t, n);
        k.embedding(&self.token_type, &vec![0; rows], &mut t);
        k.add_assign(&mut x, &t, n);
        let mut hs = k.alloc(n);
        k.layer_norm(
            &x,
            rows,
            &self.emb_norm.0,
            &self.emb_norm.1,
            c.layer_norm_eps,
            &mut hs,
        );
        let heads = AttnHeads {
            num_heads: c.num_heads,
            num_kv_heads: c.num_heads,
            head_dim: h / c.num_heads,
            scale: 1.0 / ((h / c.num_heads) as f32).sqrt(),
            window: None,
        };
        let (mut q, mut kk, mut v, mut a) = (k.alloc(n), k.alloc(n), k.alloc(n), k.alloc(n));
        let mut ff = k.alloc(rows * c.intermediate_size);
        for l in &self.layers {
            k.matmul(&hs, rows, &l.q.0, Some(&l.q.1), &mut q);
            k.matmul(&hs, rows, &l.k.0, Some(&l.k.1), &mut kk);
            k.matmul(&hs, rows, &l.v.0, Some(&l.v.1), &mut v);
            k.encoder_attention(&q, &kk, &v, seqs, heads, &mut a);
            k.matmul(&a, rows, &l.o.0, Some(&l.o.1), &mut x);
            k.add_assign(&mut x, &hs, n);
            k.layer_norm(
                &x,
                rows,
                &l.attn_norm.0,
                &l.attn_norm.1,
                c.layer_norm_eps,
                &mut hs,
            );
            k.matmul(&hs, rows, &l.up.0, Some(&l.up.1), &mut ff);
            k.gelu(&mut ff, rows * c.intermediate_size);
            k.matmul(&ff, rows, &l.down.0, Some(&l.down.1), &mut x);
            k.add_assign(&mut x, &hs, n);
            k.layer_norm(&x, rows, &l.ffn_norm.0, &l.ffn_norm.1, c.layer_norm_eps, &mut hs);
        }
        let mut out = vec![0.0f32; n];
        k.read(&hs, &mut out);
        out
    }
}
