//! Random weights in Hugging Face's tensor layout, generated lazily tensor by tensor while
//! `safetensors::serialize_to_file` writes them, so even the 5 GB f32 Llama-3.2-1B shape needs only one
//! tensor in memory at a time.
//!
//! Invariants: a tensor's values depend only on (seed, tensor name, element index) — each 64 Ki-element
//! chunk has its own ChaCha8 stream — so output is identical whatever the thread count or write order.
//! Scales keep activations O(1) through any depth, so greedy continuations of random models are not
//! degenerate: linear weights and biases ~ N(0, 1/fan_in) (every projection roughly preserves the RMS
//! of its normalised input), embeddings ~ N(0, 1/hidden) (a tied LM head then gives logits of standard
//! deviation ≈ 1), norm weights 1. (HF's own N(0, 0.02) init makes a 2-layer tied model just repeat its
//! last token, which makes a poor reference test.)

use super::families::Extra;
use super::shapes::ModelShape;
use half::{bf16, f16};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Dtype, View};
use std::borrow::Cow;

/// Elements per independently seeded chunk.
const CHUNK: usize = 1 << 16;

/// How a tensor is filled.
#[derive(Clone, Copy, Debug)]
enum Init {
    Normal(f64),
    Ones,
    /// `mean` + N(0, std²): the norm weights of the newer families, so a norm loaded wrongly shows.
    Around(f64, f64),
}

/// A tensor generated on demand.
pub(crate) struct LazyTensor {
    name: String,
    shape: Vec<usize>,
    dtype: Dtype,
    init: Init,
    seed: u64,
}

impl LazyTensor {
    /// Shape, outermost first.
    pub(crate) fn dims(&self) -> &[usize] {
        &self.shape
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The tensor's values as f32 (rounded to the stored dtype later).
    pub(crate) fn values(&self) -> Vec<f32> {
        let n = self.numel();
        let mut out = vec![0f32; n];
        let (mean, std) = match self.init {
            Init::Ones => {
                out.fill(1.0);
                return out;
            }
            Init::Normal(std) => (0.0, std),
            Init::Around(mean, std) => (mean, std),
        };
        let base = self.seed ^ fnv1a(self.name.as_bytes());
        let chunks: Vec<(usize, &mut [f32])> = out.chunks_mut(CHUNK).enumerate().collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = chunks.len().div_ceil(threads).max(1);
        let mut groups: Vec<Vec<(usize, &mut [f32])>> = Vec::new();
        let mut it = chunks.into_iter().peekable();
        while it.peek().is_some() {
            groups.push(it.by_ref().take(per).collect());
        }
        std::thread::scope(|s| {
            for g in groups {
                s.spawn(move || {
                    for (i, c) in g {
                        fill_normal(
                            c,
                            std,
                            base.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                        );
                        if mean != 0.0 {
                            c.iter_mut().for_each(|x| *x = (*x as f64 + mean) as f32);
                        }
                    }
                });
            }
        });
        out
    }
}

fn fill_normal(out: &mut [f32], std: f64, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for pair in out.chunks_mut(2) {
        // Box–Muller; 1 - u keeps the logarithm finite.
        let (u1, u2): (f64, f64) = (1.0 - rng.random::<f64>(), rng.random::<f64>());
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let t = std::f64::consts::TAU * u2;
        pair[0] = (r * t.cos()) as f32;
        if let Some(second) = pair.get_mut(1) {
            *second = (r * t.sin()) as f32;
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl View for LazyTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let v = self.values();
        let bytes: Vec<u8> = match self.dtype {
            Dtype::F16 => v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
            Dtype::BF16 => v.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes()).collect(),
            _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        Cow::Owned(bytes)
    }

    fn data_len(&self) -> usize {
        self.numel() * self.dtype.bitsize() / 8
    }
}

/// Every tensor of `shape`, in HF names.
pub(crate) fn tensors(shape: &ModelShape, dtype: Dtype, seed: u64) -> Vec<(String, LazyTensor)> {
    let (h, hd) = (shape.hidden, shape.head_dim());
    let (q, kv, i) = (shape.heads * hd, shape.kv_heads * hd, shape.intermediate);
    let mut out = Vec::new();
    let mut add = |name: String, dims: Vec<usize>, init: Init| {
        out.push((
            name.clone(),
            LazyTensor {
                name,
                shape: dims,
                dtype,
                init,
                seed,
            },
        ));
    };
    let lin = |fan_in: usize| Init::Normal(1.0 / (fan_in as f64).sqrt());
    // Norm weights: 1 for the Llama family; around 1 for the newer ones, Gemma's stored as w of (1 + w).
    let norm = match shape.extra {
        Extra::None => Init::Ones,
        Extra::Gemma3 { .. } => Init::Normal(0.1),
        _ => Init::Around(1.0, 0.1),
    };
    // Gemma's post-attention/post-FFN norms scale each branch by (1 + w) ≈ 3: the √hidden-scaled
    // embedding then no longer dominates the residual, and a tied random model does not just repeat
    // its last token.
    let gemma = matches!(shape.extra, Extra::Gemma3 { .. });
    let post_norm = if gemma { Init::Around(2.0, 0.1) } else { norm };
    let qk_norm = matches!(
        shape.extra,
        Extra::Qwen3 | Extra::Qwen3Moe { .. } | Extra::Gemma3 { .. }
    );
    add("model.embed_tokens.weight".into(), vec![shape.vocab, h], lin(h));
    for l in 0..shape.layers {
        let p = format!("model.layers.{l}");
        add(format!("{p}.input_layernorm.weight"), vec![h], norm);
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            if gemma { post_norm } else { norm },
        );
        if let Extra::Gemma3 { .. } = shape.extra {
            add(format!("{p}.pre_feedforward_layernorm.weight"), vec![h], norm);
            add(
                format!("{p}.post_feedforward_layernorm.weight"),
                vec![h],
                post_norm,
            );
        }
        if let Extra::Phi3 { .. } = shape.extra {
            add(
                format!("{p}.self_attn.qkv_proj.weight"),
                vec![q + 2 * kv, h],
                lin(h),
            );
        } else {
            add(format!("{p}.self_attn.q_proj.weight"), vec![q, h], lin(h));
            add(format!("{p}.self_attn.k_proj.weight"), vec![kv, h], lin(h));
            add(format!("{p}.self_attn.v_proj.weight"), vec![kv, h], lin(h));
        }
        add(format!("{p}.self_attn.o_proj.weight"), vec![h, q], lin(q));
        if shape.qkv_bias {
            add(format!("{p}.self_attn.q_proj.bias"), vec![q], lin(h));
            add(format!("{p}.self_attn.k_proj.bias"), vec![kv], lin(h));
            add(format!("{p}.self_attn.v_proj.bias"), vec![kv], lin(h));
        }
        if qk_norm {
            add(format!("{p}.self_attn.q_norm.weight"), vec![hd], norm);
            add(format!("{p}.self_attn.k_norm.weight"), vec![hd], norm);
        }
        match shape.extra {
            Extra::Phi3 { .. } => {
                add(format!("{p}.mlp.gate_up_proj.weight"), vec![2 * i, h], lin(h));
                add(format!("{p}.mlp.down_proj.weight"), vec![h, i], lin(i));
            }
            Extra::Qwen3Moe {
                experts, expert_ff, ..
            } => {
                // Router logits of standard deviation ≈ 3: the top-2 choice varies by token and the two
                // renormalised weights are far from equal.
                add(
                    format!("{p}.mlp.gate.weight"),
                    vec![experts, h],
                    Init::Normal(0.2),
                );
                for e in 0..experts {
                    let x = format!("{p}.mlp.experts.{e}");
                    add(format!("{x}.gate_proj.weight"), vec![expert_ff, h], lin(h));
                    add(format!("{x}.up_proj.weight"), vec![expert_ff, h], lin(h));
                    add(
                        format!("{x}.down_proj.weight"),
                        vec![h, expert_ff],
                        lin(expert_ff),
                    );
                }
            }
            _ => {
                add(format!("{p}.mlp.gate_proj.weight"), vec![i, h], lin(h));
                add(format!("{p}.mlp.up_proj.weight"), vec![i, h], lin(h));
                add(format!("{p}.mlp.down_proj.weight"), vec![h, i], lin(i));
            }
        }
    }
    add("model.norm.weight".into(), vec![h], norm);
    if !shape.tied {
        add("lm_head.weight".into(), vec![shape.vocab, h], lin(h));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_depend_only_on_seed_and_name_and_have_the_right_scale() {
        let t = |name: &str, seed| LazyTensor {
            name: name.into(),
            shape: vec![300, 1000],
            dtype: Dtype::F32,
            init: Init::Normal(0.5),
            seed,
        };
        let a = t("x", 1).values();
        assert_eq!(a, t("x", 1).values());
        assert_ne!(a, t("y", 1).values());
        assert_ne!(a, t("x", 2).values());
        let var = a.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / a.len() as f64;
        assert!((var.sqrt() - 0.5).abs() < 0.01, "std {}", var.sqrt());
    }
}
