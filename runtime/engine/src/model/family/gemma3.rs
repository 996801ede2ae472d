//! Gemma 3 (text; 270M–27B): embeddings × √hidden; "sandwich" norms (RMSNorm before and after both
//! attention and the FFN); per-head q/k RMSNorm; GeGLU with tanh GELU; RMSNorm weights stored as
//! offsets from 1 in safetensors (`x · (1 + w)`; llama.cpp's converter adds the 1); five local layers
//! (sliding window, RoPE base `rope_local_base_freq`, unscaled) for every global one (RoPE base
//! `rope_theta`, with `rope_scaling`); scores scaled by `query_pre_attn_scalar^-½`; an optional final
//! logit softcap.
//!
//! Sources: `transformers`' `Gemma3TextConfig`/`modeling_gemma3.py` for the keys and defaults,
//! llama.cpp's `src/models/gemma3.cpp` and `convert_hf_to_gguf.py` for the GGUF side.

use super::{ErrFn, check_activation, opt_f32, opt_usize};
use crate::error::{EngineError, Result};
use crate::model::config::ModelConfig;
use crate::model::gguf::{GgufFile, GgufValue};
use serde_json::{Map, Value, json};

/// `Gemma3TextConfig`'s defaults.
const DEFAULT_WINDOW: usize = 4096;
const DEFAULT_PATTERN: usize = 6;
const DEFAULT_LOCAL_BASE: f32 = 10_000.0;
const DEFAULT_QUERY_PRE_ATTN_SCALAR: f32 = 256.0;

pub(super) fn apply_hf(v: &Value, c: &mut ModelConfig, err: ErrFn<'_>) -> Result<()> {
    // `Gemma3TextConfig`'s default (no key) is the tanh approximation too.
    check_activation(v, &["gelu_pytorch_tanh"], err)?;
    if let Some(cap) = v.get("attn_logit_softcapping").filter(|x| !x.is_null()) {
        return Err(err(
            "attn_logit_softcapping",
            format!("{cap} is not supported (only null, as Gemma 3 ships)"),
        ));
    }
    c.activation = crate::model::config::Activation::GeluTanh;
    c.qk_norm = true;
    c.sandwich_norms = true;
    c.norm_weight_offset = true;
    c.embed_scale = Some((c.hidden_size as f32).sqrt());
    if v.get("tie_word_embeddings").is_none() {
        c.tie_word_embeddings = true;
    }
    let scalar = opt_f32(v, "query_pre_attn_scalar", err)?.unwrap_or(DEFAULT_QUERY_PRE_ATTN_SCALAR);
    c.attn_scale = 1.0 / scalar.sqrt();
    c.final_logit_softcap = opt_f32(v, "final_logit_softcapping", err)?;
    c.rope_local_theta = Some(opt_f32(v, "rope_local_base_freq", err)?.unwrap_or(DEFAULT_LOCAL_BASE));
    let window = opt_usize(v, "sliding_window", err)?.unwrap_or(DEFAULT_WINDOW);
    c.sliding_window = Some(window);
    c.local_layers = local_layers(v, c.num_layers, err)?;
    Ok(())
}

/// Per layer, whether it is local: from `layer_types` (newer configs) or `sliding_window_pattern`
/// (layer `i` is local iff `i % pattern < pattern − 1`).
fn local_layers(v: &Value, n: usize, err: ErrFn<'_>) -> Result<Vec<bool>> {
    if let Some(types) = v.get("layer_types").filter(|x| !x.is_null()) {
        let list = types
            .as_array()
            .filter(|a| a.len() == n)
            .ok_or_else(|| err("layer_types", format!("must list one type per layer ({n})")))?;
        return list
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(err(
                    "layer_types",
                    format!("{t} is not \"sliding_attention\" or \"full_attention\""),
                )),
            })
            .collect();
    }
    let pattern = opt_usize(v, "sliding_window_pattern", err)?.unwrap_or(DEFAULT_PATTERN);
    Ok((0..n).map(|i| i % pattern < pattern - 1).collect())
}

/// The HF names of the Gemma-specific GGUF layer tensors.
pub(super) fn gguf_tensor(part: &str) -> Option<&'static str> {
    Some(match part {
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        _ => return None,
    })
}

/// `config.json` keys from `gemma3.*` metadata, as llama.cpp reads them (`llama_model_gemma3`): the
/// window, the pattern (a count, or one flag per layer), the local RoPE base (default 10000), the
/// softcap, and the score scale (`1/√head_dim`, `1/√(hidden/heads)` for the 62-layer 27B).
pub(super) fn gguf_keys(g: &GgufFile, hf: &mut Map<String, Value>) -> Result<()> {
    let err = |k: &str, m: &str| EngineError::Config {
        path: g.path.clone(),
        field: format!("gemma3.{k}"),
        message: m.into(),
    };
    let num = |k: &str| g.get(&format!("gemma3.{k}")).and_then(GgufValue::as_f64);
    hf.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
    match num("attention.sliding_window") {
        Some(w) if w > 0.0 => {
            hf.insert("sliding_window".into(), json!(w as usize));
            match g.get("gemma3.attention.sliding_window_pattern") {
                None => {}
                Some(GgufValue::Array(flags)) => {
                    let types: Vec<&str> = flags
                        .iter()
                        .map(|f| match f {
                            GgufValue::Bool(true) => "sliding_attention",
                            _ => "full_attention",
                        })
                        .collect();
                    hf.insert("layer_types".into(), json!(types));
                }
                Some(v) => {
                    let p = v.as_u64().ok_or_else(|| {
                        err(
                            "attention.sliding_window_pattern",
                            "must be an integer or a list of flags",
                        )
                    })?;
                    hf.insert("sliding_window_pattern".into(), json!(p));
                }
            }
        }
        _ => {
            // No window: every layer global.
            hf.insert("sliding_window_pattern".into(), json!(1));
        }
    }
    hf.insert(
        "rope_local_base_freq".into(),
        json!(num("rope.freq_base_swa").unwrap_or(DEFAULT_LOCAL_BASE as f64)),
    );
    if let Some(cap) = num("final_logit_softcapping").filter(|&c| c > 0.0) {
        hf.insert("final_logit_softcapping".into(), json!(cap));
    }
    let layers = num("block_count").unwrap_or(0.0) as usize;
    let (hidden, heads) = (num("embedding_length"), num("attention.head_count"));
    let scalar = match (layers, hidden, heads, num("attention.key_length")) {
        (62, Some(h), Some(n), _) if n > 0.0 => (h as usize / n as usize) as f64,
        (_, _, _, Some(k)) => k,
        (_, Some(h), Some(n), None) if n > 0.0 => h / n,
        _ => return Err(err("attention.key_length", "missing")),
    };
    hf.insert("query_pre_attn_scalar".into(), json!(scalar));
    Ok(())
}
