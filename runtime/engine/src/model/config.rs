//! `config.json` of a Hugging Face decoder model, parsed into the [`ModelConfig`] the forward pass
//! uses: the keys every family shares (sizes, heads, RoPE base and scaling — `llama3`, `linear` —,
//! tied embeddings, BOS/EOS) here, and what each family adds (q/k norms, sandwich norms, GeGLU, sliding
//! windows, …) in its own file under `model::family`.
//!
//! Invariants: a `ModelConfig` is internally consistent (heads divide evenly, `head_dim` is even,
//! sizes non-zero, one entry of `local_layers` per layer) — every check happens here or in the family
//! file, with errors naming the file and the field, so the forward pass never meets a shape it cannot
//! run. Features the engine cannot honour exactly (unknown rope scaling, other activations, attention
//! softcapping) are refused, never ignored.
//!
//! Defaults follow `transformers`' config classes of each family.

use crate::error::{EngineError, Result, parse_json, read_to_string};
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The model families the engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM` (Llama 1/2/3.x, SmolLM, TinyLlama…).
    Llama,
    /// `MistralForCausalLM`.
    Mistral,
    /// `Qwen2ForCausalLM` (bias on q/k/v projections).
    Qwen2,
    /// `Qwen3ForCausalLM` (per-head q/k RMSNorm, explicit head_dim).
    Qwen3,
    /// `Gemma3ForCausalLM`, text only (sandwich norms, GeGLU, local and global layers).
    Gemma3,
    /// `Qwen3MoeForCausalLM`: Qwen3's attention and a top-k mixture of SwiGLU experts.
    Qwen3Moe,
    /// `Phi3ForCausalLM` (Phi-3, Phi-3.5-mini, Phi-4-mini): fused q/k/v and gate/up projections,
    /// LongRoPE, partial rotary dimensions.
    Phi3,
}

/// A mixture of experts in place of the dense FFN (Qwen3-MoE): a router picks `top_k` of
/// `num_experts` SwiGLU experts per token, whose outputs are summed with the router's weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    /// Experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Each expert's inner width (`moe_intermediate_size`).
    pub expert_ff: usize,
    /// The top-k router weights are renormalised to sum to 1 (`norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// Per layer, whether it is a MoE layer (the others keep a dense FFN of `intermediate_size`).
    pub layers: Vec<bool>,
}

impl Moe {
    /// Whether layer `l` routes to experts.
    pub fn is_moe(&self, l: usize) -> bool {
        self.layers.get(l).copied().unwrap_or(false)
    }
}

/// The FFN's gating activation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up`.
    #[default]
    Silu,
    /// GeGLU with the tanh approximation of GELU (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// Rotary-embedding frequency scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (`"linear"`).
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling (`"llama3"`).
    Llama3 {
        /// Scale of low frequencies.
        factor: f32,
        /// Wavelength threshold (relative) below which frequencies are fully scaled.
        low_freq_factor: f32,
        /// Wavelength threshold (relative) above which frequencies are kept.
        high_freq_factor: f32,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
}

/// LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini): per-pair frequency divisors for contexts within the
/// pre-training length (`short`) and beyond it (`long`), and a factor on the rotary cosines and sines.
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// Divisors used when the served context fits `original_max_position_embeddings`.
    pub short_factor: Vec<f32>,
    /// Divisors used when it does not.
    pub long_factor: Vec<f32>,
    /// The pre-training context length.
    pub original_max_position_embeddings: usize,
    /// The cosines and sines are multiplied by this (`√(1 + ln s / ln L)` for `s = max/original`,
    /// `L = original`, unless the config gives `attention_factor`).
    pub attention_factor: f32,
}

/// A validated model configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Model family.
    pub architecture: Architecture,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Rows of the embedding matrix (may exceed the tokenizer's vocabulary).
    pub vocab_size: usize,
    /// The longest context the model supports.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE scaling, if any.
    pub rope_scaling: Option<RopeScaling>,
    /// The LM head reuses the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Bias on the q/k/v projections (Qwen2, or Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (Llama with `attention_bias`).
    pub o_bias: bool,
    /// BOS token id, if the config names one.
    pub bos_token_id: Option<u32>,
    /// EOS token ids from `config.json` (generation_config.json usually has the authoritative list).
    pub eos_token_ids: Vec<u32>,
    /// RoPE pairs adjacent elements instead of rotating halves: true for GGUF Llama files, whose
    /// converter permuted the Q/K rows for GGML's "normal" RoPE mode.
    pub rope_interleaved: bool,
    /// Per-head RMSNorm of queries and keys before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm of the attention output and of the FFN output before each residual add (Gemma's
    /// "sandwich"); the FFN's input norm is then `pre_feedforward_layernorm`.
    pub sandwich_norms: bool,
    /// RMSNorm weights are stored as offsets from 1 (Gemma in safetensors: `x · (1 + w)`); GGUF files
    /// have the 1 added by their converter.
    pub norm_weight_offset: bool,
    /// The FFN's activation.
    pub activation: Activation,
    /// The embeddings are multiplied by this (Gemma: √hidden_size).
    pub embed_scale: Option<f32>,
    /// The attention score scale (`1/√head_dim`, or Gemma's `query_pre_attn_scalar^-½`).
    pub attn_scale: f32,
    /// `cap · tanh(logit / cap)` on the final logits (Gemma's `final_logit_softcapping`).
    pub final_logit_softcap: Option<f32>,
    /// The sliding window of the local layers (tokens a query sees, itself included).
    pub sliding_window: Option<usize>,
    /// Per layer, whether it is local (attends within `sliding_window` only, with the local RoPE).
    pub local_layers: Vec<bool>,
    /// RoPE base of the local layers (Gemma 3's `rope_local_base_freq`); unscaled. `None`: local
    /// layers use the global RoPE.
    pub rope_local_theta: Option<f32>,
    /// A mixture of experts on some or all layers.
    pub moe: Option<Moe>,
    /// Elements of each head that RoPE rotates (the first ones): `head_dim`, or fewer with Phi's
    /// `partial_rotary_factor`; always even.
    pub rotary_dim: usize,
    /// LongRoPE's factors, in place of `rope_scaling`.
    pub long_rope: Option<LongRope>,
    /// The longest context this load serves (the engine's `max_model_len`; `max_position_embeddings`
    /// until the engine sets it). LongRoPE picks its factors by it once, as llama.cpp does by its
    /// context size, so a position's rotation never changes while its keys sit in the KV cache.
    pub serving_context: usize,
}

#[derive(Deserialize)]
struct Raw {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    max_position_embeddings: usize,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
}

impl ModelConfig {
    /// Reads and validates `path` (a `config.json`).
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::from_json(path, &read_to_string(path)?)
    }

    /// Parses and validates `text`; `path` is only used in error messages.
    pub fn from_json(path: &Path, text: &str) -> Result<Self> {
        let raw: Raw = parse_json(path, text)?;
        let err = |field: &str, message: String| EngineError::Config {
            path: path.to_path_buf(),
            field: field.to_string(),
            message,
        };
        let architecture = architecture(path, &raw)?;
        for (field, v) in [
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", raw.num_attention_heads),
            ("vocab_size", raw.vocab_size),
            ("max_position_embeddings", raw.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(err(field, "must be greater than 0".into()));
            }
        }
        let num_heads = raw.num_attention_heads;
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(num_heads);
        if num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(err(
                "num_key_value_heads",
                format!("{num_kv_heads} does not divide num_attention_heads ({num_heads})"),
            ));
        }
        let head_dim = match raw.head_dim {
            Some(d) => d,
            None if raw.hidden_size.is_multiple_of(num_heads) => raw.hidden_size / num_heads,
            None => {
                return Err(err(
                    "num_attention_heads",
                    format!("{num_heads} does not divide hidden_size ({})", raw.hidden_size),
                ));
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(err(
                "head_dim",
                format!("{head_dim} must be even and non-zero (rotary pairs)"),
            ));
        }
        if raw.mlp_bias == Some(true) {
            return Err(err("mlp_bias", "true is not supported".into()));
        }
        if !(raw.rms_norm_eps.is_finite() && raw.rms_norm_eps > 0.0) {
            return Err(err(
                "rms_norm_eps",
                format!("{} must be a positive number", raw.rms_norm_eps),
            ));
        }
        let rope_theta = raw.rope_theta.unwrap_or(10_000.0);
        if !(rope_theta.is_finite() && rope_theta > 1.0) {
            return Err(err(
                "rope_theta",
                format!("{rope_theta} must be a number greater than 1"),
            ));
        }
        let rope_scaling = match &raw.rope_scaling {
            None | Some(Value::Null) => None,
            // LongRoPE: read by `family::phi3`.
            Some(_) if architecture == Architecture::Phi3 => None,
            Some(v) => rope_scaling(path, v)?,
        };
        let attention_bias = raw.attention_bias.unwrap_or(false);
        let mut config = ModelConfig {
            architecture,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: raw.vocab_size,
            max_position_embeddings: raw.max_position_embeddings,
            rms_norm_eps: raw.rms_norm_eps as f32,
            rope_theta: rope_theta as f32,
            rope_scaling,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias: architecture == Architecture::Qwen2 || attention_bias,
            o_bias: architecture == Architecture::Llama && attention_bias,
            bos_token_id: token_ids(path, "bos_token_id", raw.bos_token_id.as_ref())?
                .first()
                .copied(),
            eos_token_ids: token_ids(path, "eos_token_id", raw.eos_token_id.as_ref())?,
            rope_interleaved: false,
            qk_norm: false,
            sandwich_norms: false,
            norm_weight_offset: false,
            activation: Activation::Silu,
            embed_scale: None,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            final_logit_softcap: None,
            sliding_window: None,
            local_layers: vec![false; raw.num_hidden_layers],
            rope_local_theta: None,
            moe: None,
            rotary_dim: head_dim,
            long_rope: None,
            serving_context: raw.max_position_embeddings,
        };
        let value: Value = parse_json(path, text)?;
        super::family::apply_hf(&value, &mut config, &err)?;
        Ok(config)
    }

    /// Whether layer `l`'s FFN is a mixture of experts.
    pub fn is_moe(&self, l: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_moe(l))
    }

    /// The widest FFN inner width of any layer (dense or one expert's).
    pub fn ffn_width(&self) -> usize {
        let expert = self.moe.as_ref().map_or(0, |m| m.expert_ff);
        self.intermediate_size.max(expert)
    }

    /// Whether layer `l` attends within the sliding window only.
    pub fn is_local(&self, l: usize) -> bool {
        self.local_layers.get(l).copied().unwrap_or(false)
    }

    /// Per layer, the window its KV-cache group keeps (`crate::kv::KvGroups`) when serving
    /// `context` tokens: a local layer's `sliding_window` when it is shorter, else `None` (the whole
    /// context).
    pub fn layer_windows(&self, context: usize) -> Vec<Option<usize>> {
        (0..self.num_layers)
            .map(|l| {
                let w = self.sliding_window.filter(|&w| self.is_local(l) && w < context);
                w.filter(|&w| w > 0)
            })
            .collect()
    }

    /// The factor on RoPE's cosines and sines (LongRoPE's attention factor; 1 otherwise).
    pub fn rope_scale(&self) -> f32 {
        self.long_rope.as_ref().map_or(1.0, |l| l.attention_factor)
    }

    /// Per-pair RoPE inverse frequencies of the local layers: [`Self::inv_freq`] unless the family
    /// gives local layers their own (unscaled) base.
    pub fn inv_freq_local(&self) -> Vec<f32> {
        match self.rope_local_theta {
            None => self.inv_freq(),
            Some(theta) => ModelConfig {
                rope_theta: theta,
                rope_scaling: None,
                ..self.clone()
            }
            .inv_freq(),
        }
    }

    /// Per-pair RoPE inverse frequencies (`rotary_dim / 2`), with scaling applied — the same f32
    /// arithmetic as `transformers` and `candle-transformers`.
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.rotary_dim;
        let base: Vec<f32> = (0..d)
            .step_by(2)
            .map(|i| 1.0 / self.rope_theta.powf(i as f32 / d as f32))
            .collect();
        if let Some(lr) = &self.long_rope {
            let factors = if self.serving_context > lr.original_max_position_embeddings {
                &lr.long_factor
            } else {
                &lr.short_factor
            };
            // `1 / (factor · base^(2i/d))`, as `transformers`' longrope computes it.
            return (0..d)
                .step_by(2)
                .zip(factors)
                .map(|(i, f)| 1.0 / (f * self.rope_theta.powf(i as f32 / d as f32)))
                .collect();
        }
        match self.rope_scaling {
            None => base,
            Some(RopeScaling::Linear { factor }) => base.into_iter().map(|f| f / factor).collect(),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let old = original_max_position_embeddings as f32;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                base.into_iter()
                    .map(|freq| {
                        let wavelen = 2.0 * std::f32::consts::PI / freq;
                        if wavelen < high_wavelen {
                            freq
                        } else if wavelen > low_wavelen {
                            freq / factor
                        } else {
                            let smooth =
                                (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * freq / factor + smooth * freq
                        }
                    })
                    .collect()
            }
        }
    }
}

/// The architectures `config.json` may name, as it names them.
pub const SUPPORTED: [&str; 7] = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Gemma3ForCausalLM",
    "Phi3ForCausalLM",
];

fn architecture(path: &Path, raw: &Raw) -> Result<Architecture> {
    let from_name = |s: &str| match s {
        "LlamaForCausalLM" | "llama" => Some(Architecture::Llama),
        "MistralForCausalLM" | "mistral" => Some(Architecture::Mistral),
        "Qwen2ForCausalLM" | "qwen2" => Some(Architecture::Qwen2),
        "Qwen3ForCausalLM" | "qwen3" => Some(Architecture::Qwen3),
        "Qwen3MoeForCausalLM" | "qwen3_moe" => Some(Architecture::Qwen3Moe),
        "Gemma3ForCausalLM" | "gemma3_text" => Some(Architecture::Gemma3),
        "Phi3ForCausalLM" | "phi3" => Some(Architecture::Phi3),
        _ => None,
    };
    let (field, name) = match (&raw.architectures, &raw.model_type) {
        (Some(a), _) if !a.is_empty() => ("architectures", a[0].clone()),
        (_, Some(t)) => ("model_type", t.clone()),
        _ => {
            return Err(EngineError::Config {
                path: path.to_path_buf(),
                field: "architectures".into(),
                message: "missing (and no model_type either)".into(),
            });
        }
    };
    from_name(&name).ok_or_else(|| EngineError::Config {
        path: path.to_path_buf(),
        field: field.into(),
        message: format!("{name:?} is not supported ({})", SUPPORTED.join(", ")),
    })
}

fn rope_scaling(path: &Path, v: &Value) -> Result<Option<RopeScaling>> {
    let err = |field: &str, message: String| EngineError::Config {
        path: PathBuf::from(path),
        field: format!("rope_scaling.{field}"),
        message,
    };
    let kind = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |field: &str| -> Result<f32> {
        match v.get(field).and_then(Value::as_f64) {
            Some(x) if x.is_finite() && x > 0.0 => Ok(x as f32),
            Some(x) => Err(err(field, format!("{x} must be a positive number"))),
            None => Err(err(field, "missing".into())),
        }
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: num("factor")?,
        })),
        "llama3" => {
            let (low, high) = (num("low_freq_factor")?, num("high_freq_factor")?);
            if high <= low {
                return Err(err(
                    "high_freq_factor",
                    format!("{high} must exceed low_freq_factor ({low})"),
                ));
            }
            Ok(Some(RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: num("original_max_position_embeddings")? as usize,
            }))
        }
        other => Err(err(
            "rope_type",
            format!("{other:?} is not supported (default, linear, llama3)"),
        )),
    }
}

/// A token id field that may be absent, null, an integer or a list of integers.
pub(crate) fn token_ids(path: &Path, field: &str, v: Option<&Value>) -> Result<Vec<u32>> {
    let bad = || EngineError::Config {
        path: path.to_path_buf(),
        field: field.to_string(),
        message: "must be a token id, a list of token ids, or null".into(),
    };
    let one = |v: &Value| v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(bad);
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":576,"intermediate_size":1536,
        "num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,"vocab_size":49152,
        "max_position_embeddings":8192,"rms_norm_eps":1e-5,"rope_theta":100000,"tie_word_embeddings":true,
        "hidden_act":"silu","bos_token_id":1,"eos_token_id":2,"rope_scaling":null}"#;

    fn parse(text: &str) -> Result<ModelConfig> {
        ModelConfig::from_json(Path::new("m/config.json"), text)
    }

    fn with(extra: &str) -> String {
        SMOLLM.trim_end_matches('}').to_string() + "," + extra + "}"
    }

    #[test]
    fn smollm_parses_with_gqa_and_tied_embeddings() {
        let c = parse(SMOLLM).unwrap();
        assert_eq!(
            (c.architecture, c.head_dim, c.num_kv_heads),
            (Architecture::Llama, 64, 3)
        );
        assert!(c.tie_word_embeddings && !c.qkv_bias);
        assert_eq!((c.bos_token_id, c.eos_token_ids.clone()), (Some(1), vec![2]));
        assert_eq!(c.inv_freq().len(), 32);
    }

    #[test]
    fn llama3_rope_scaling_matches_reference_values() {
        let text = SMOLLM
            .replace(
                r#""rope_scaling":null"#,
                r#""rope_scaling":{"rope_type":"llama3","factor":32.0,
            "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}"#,
            )
            .replace(r#""rope_theta":100000"#, r#""rope_theta":500000"#);
        let c = parse(&text).unwrap();
        let f = c.inv_freq();
        assert_eq!(f[0], 1.0); // highest frequency untouched
        let unscaled = 1.0 / 500000f32.powf(62.0 / 64.0);
        assert!(
            (f[31] - unscaled / 32.0).abs() < 1e-12,
            "lowest frequency divided by the factor"
        );
    }

    fn check_err(text: &str, field: &str, needle: &str) {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.starts_with("m/config.json"), "{e}");
        assert!(
            e.contains(field) && e.contains(needle),
            "{e} lacks {field} / {needle}"
        );
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        check_err(
            &SMOLLM.replace("LlamaForCausalLM", "GPT2LMHeadModel"),
            "architectures",
            "GPT2LMHeadModel",
        );
        check_err(
            &SMOLLM.replace(r#""hidden_size":576,"#, ""),
            "hidden_size",
            "missing field",
        );
        check_err(
            &SMOLLM.replace(r#""num_key_value_heads":3"#, r#""num_key_value_heads":4"#),
            "num_key_value_heads",
            "4",
        );
        check_err(
            &with(r#""hidden_act":"gelu""#).replace(r#""hidden_act":"silu","#, ""),
            "hidden_act",
            "gelu",
        );
        check_err(
            &with(r#""sliding_window":"x""#),
            "sliding_window",
            "not a positive integer",
        );
        check_err(
            &SMOLLM.replace("LlamaForCausalLM", "PhiMoEForCausalLM"),
            "architectures",
            "Phi3ForCausalLM",
        );
        check_err(
            &SMOLLM.replace(
                r#""rope_scaling":null"#,
                r#""rope_scaling":{"type":"yarn","factor":4}"#,
            ),
            "rope_scaling.rope_type",
            "yarn",
        );
        check_err(
            &SMOLLM.replace(r#""eos_token_id":2"#, r#""eos_token_id":"x""#),
            "eos_token_id",
            "token id",
        );
        check_err("{", "m/config.json", "EOF");
    }

    #[test]
    fn mistral_window_at_least_the_context_is_ignored_and_qwen2_has_bias() {
        let m = with(r#""sliding_window":8192"#).replace("LlamaForCausalLM", "MistralForCausalLM");
        assert_eq!(parse(&m).unwrap().architecture, Architecture::Mistral);
        let null = with(r#""sliding_window":null"#).replace("LlamaForCausalLM", "MistralForCausalLM");
        assert!(parse(&null).is_ok());
        let q = with(r#""sliding_window":4096,"use_sliding_window":false"#)
            .replace("LlamaForCausalLM", "Qwen2ForCausalLM");
        let c = parse(&q).unwrap();
        assert!(c.qkv_bias && !c.o_bias);
        let q_on = q.replace(r#""use_sliding_window":false"#, r#""use_sliding_window":true"#);
        assert!(parse(&q_on).is_err());
        let short = with(r#""sliding_window":4096"#).replace("LlamaForCausalLM", "MistralForCausalLM");
        let c = parse(&short).unwrap();
        assert_eq!(c.sliding_window, Some(4096));
        assert!(c.local_layers.iter().all(|&l| l) && c.local_layers.len() == 30);
        let eos = SMOLLM.replace(r#""eos_token_id":2"#, r#""eos_token_id":[2, 7]"#);
        assert_eq!(parse(&eos).unwrap().eos_token_ids, vec![2, 7]);
    }

    /// Qwen3-0.6B's config.json (abridged to the keys the engine reads).
    const QWEN3: &str = r#"{"architectures":["Qwen3ForCausalLM"],"attention_bias":false,"head_dim":128,
        "hidden_act":"silu","hidden_size":1024,"intermediate_size":3072,"max_position_embeddings":40960,
        "max_window_layers":28,"model_type":"qwen3","num_attention_heads":16,"num_hidden_layers":28,
        "num_key_value_heads":8,"rms_norm_eps":1e-06,"rope_scaling":null,"rope_theta":1000000,
        "sliding_window":null,"tie_word_embeddings":true,"use_sliding_window":false,"vocab_size":151936,
        "bos_token_id":151643,"eos_token_id":151645}"#;

    /// gemma-3-270m's config.json (abridged).
    const GEMMA3: &str = r#"{"architectures":["Gemma3ForCausalLM"],"attention_bias":false,
        "attn_logit_softcapping":null,"final_logit_softcapping":null,"head_dim":256,
        "hidden_activation":"gelu_pytorch_tanh","hidden_size":640,"intermediate_size":2048,
        "max_position_embeddings":32768,"model_type":"gemma3_text","num_attention_heads":4,
        "num_hidden_layers":18,"num_key_value_heads":1,"query_pre_attn_scalar":256,"rms_norm_eps":1e-06,
        "rope_local_base_freq":10000.0,"rope_scaling":null,"rope_theta":1000000.0,"sliding_window":512,
        "vocab_size":262144,"bos_token_id":2,"eos_token_id":1}"#;

    #[test]
    fn qwen3_has_qk_norms_an_explicit_head_dim_and_no_bias() {
        let c = parse(QWEN3).unwrap();
        assert_eq!(
            (c.architecture, c.head_dim, c.hidden_size / c.num_heads),
            (Architecture::Qwen3, 128, 64)
        );
        assert!(c.qk_norm && !c.qkv_bias && !c.o_bias && !c.sandwich_norms);
        assert_eq!((c.activation, c.sliding_window), (Activation::Silu, None));
        assert!((c.attn_scale - 1.0 / 128f32.sqrt()).abs() < 1e-9);
        check_err(
            &QWEN3.replace(r#""use_sliding_window":false"#, r#""use_sliding_window":true"#),
            "use_sliding_window",
            "not supported",
        );
    }

    /// Phi-4-mini-instruct's config.json (abridged; the 48 LongRoPE factors generated).
    fn phi4_mini(scaling_extra: &str) -> String {
        let list =
            |f: f64| serde_json::to_string(&(0..48).map(|i| f + i as f64 / 8.0).collect::<Vec<_>>()).unwrap();
        format!(
            r#"{{"architectures":["Phi3ForCausalLM"],"hidden_act":"silu","hidden_size":3072,
            "intermediate_size":8192,"max_position_embeddings":131072,"model_type":"phi3",
            "num_attention_heads":24,"num_hidden_layers":32,"num_key_value_heads":8,
            "original_max_position_embeddings":4096,"partial_rotary_factor":0.75,"rms_norm_eps":1e-05,
            "rope_scaling":{{"long_factor":{},"short_factor":{},"type":"longrope"{scaling_extra}}},
            "rope_theta":10000.0,"sliding_window":262144,"tie_word_embeddings":true,"vocab_size":200064,
            "bos_token_id":199999,"eos_token_id":199999}}"#,
            list(1.0),
            list(2.0),
        )
    }

    #[test]
    fn phi4_mini_rotates_three_quarters_of_each_head_with_longrope() {
        let mut c = parse(&phi4_mini("")).unwrap();
        assert_eq!(
            (c.architecture, c.head_dim, c.rotary_dim),
            (Architecture::Phi3, 128, 96)
        );
        assert!(!c.qkv_bias && !c.qk_norm && c.rope_scaling.is_none());
        // A window past the context is no window.
        assert_eq!(c.sliding_window, None);
        // √(1 + ln 32 / ln 4096), as transformers computes it.
        let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt() as f32;
        assert!((c.rope_scale() - want).abs() < 1e-6, "{}", c.rope_scale());
        // Served at the full 128k: the long factors (1 + i/8); within 4096: the short ones (2 + i/8).
        let base = |i: usize| 10_000f32.powf((2 * i) as f32 / 96.0);
        let long = c.inv_freq();
        assert_eq!(long.len(), 48);
        assert!((long[5] - 1.0 / ((1.0 + 5.0 / 8.0) * base(5))).abs() < 1e-9);
        c.serving_context = 4096;
        let short = c.inv_freq();
        assert!((short[5] - 1.0 / ((2.0 + 5.0 / 8.0) * base(5))).abs() < 1e-9);
        // An explicit attention factor wins.
        let c = parse(&phi4_mini(r#","attention_factor":1.5"#)).unwrap();
        assert_eq!(c.rope_scale(), 1.5);
        // Phi-3-mini-4k: no scaling, full rotary, a 2047-token window on every layer.
        let mini4k = phi4_mini("")
            .replace(r#""partial_rotary_factor":0.75,"#, "")
            .replace(r#""sliding_window":262144"#, r#""sliding_window":2047"#);
        let mini4k = {
            let mut v: Value = serde_json::from_str(&mini4k).unwrap();
            v["rope_scaling"] = Value::Null;
            v.to_string()
        };
        let c = parse(&mini4k).unwrap();
        assert_eq!(
            (c.rotary_dim, c.sliding_window, c.rope_scale()),
            (128, Some(2047), 1.0)
        );
        assert!(c.local_layers.iter().all(|&l| l));
    }

    #[test]
    fn phi3_errors_name_the_field() {
        check_err(
            &phi4_mini("").replace("0.75", "0.7"),
            "partial_rotary_factor",
            "even",
        );
        check_err(
            &phi4_mini("").replace(r#""type":"longrope""#, r#""type":"yarn""#),
            "rope_scaling.type",
            "longrope",
        );
        let short = {
            let mut v: Value = serde_json::from_str(&phi4_mini("")).unwrap();
            v["rope_scaling"]["short_factor"] = serde_json::json!([1.0, 2.0]);
            v.to_string()
        };
        check_err(&short, "rope_scaling.short_factor", "expected 48");
        check_err(
            &phi4_mini("").replace(r#""original_max_position_embeddings":4096,"#, ""),
            "original_max_position_embeddings",
            "missing",
        );
    }

    #[test]
    fn gemma3_layers_alternate_five_local_to_one_global() {
        let c = parse(GEMMA3).unwrap();
        assert_eq!(c.architecture, Architecture::Gemma3);
        assert!(c.qk_norm && c.sandwich_norms && c.norm_weight_offset && c.tie_word_embeddings);
        assert_eq!(c.activation, Activation::GeluTanh);
        assert_eq!((c.sliding_window, c.final_logit_softcap), (Some(512), None));
        assert_eq!(c.embed_scale, Some(640f32.sqrt()));
        assert_eq!(c.attn_scale, 1.0 / 16.0);
        let globals: Vec<usize> = (0..18).filter(|&l| !c.is_local(l)).collect();
        assert_eq!(globals, [5, 11, 17]);
        // Local layers rotate with base 10000, global ones with 1e6.
        let (local, global) = (c.inv_freq_local(), c.inv_freq());
        assert_eq!((local.len(), global.len()), (128, 128));
        assert!((local[1] - 1.0 / 10_000f32.powf(2.0 / 256.0)).abs() < 1e-9);
        assert!((global[1] - 1.0 / 1_000_000f32.powf(2.0 / 256.0)).abs() < 1e-9);
        // `layer_types` (newer configs) wins over the pattern.
        let types: Vec<&str> = (0..18)
            .map(|l| {
                if l == 0 {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();
        let listed = GEMMA3.replace(
            r#""sliding_window":512"#,
            &format!(
                r#""sliding_window":512,"layer_types":{}"#,
                serde_json::to_string(&types).unwrap()
            ),
        );
        let c = parse(&listed).unwrap();
        assert!(!c.is_local(0) && c.is_local(5));
        check_err(
            &GEMMA3.replace(
                r#""attn_logit_softcapping":null"#,
                r#""attn_logit_softcapping":50"#,
            ),
            "attn_logit_softcapping",
            "not supported",
        );
        check_err(
            &GEMMA3.replace("gelu_pytorch_tanh", "silu"),
            "hidden_activation",
            "gelu_pytorch_tanh",
        );
    }
}
