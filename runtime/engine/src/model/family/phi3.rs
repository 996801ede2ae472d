//! Phi-3, Phi-3.5-mini and Phi-4-mini (`Phi3ForCausalLM`): Llama's layer with the q/k/v projections
//! fused into one `qkv_proj` and the gate/up ones into one `gate_up_proj` (the decoder slices their
//! rows: `Weights::get_row_split`); RoPE on the first `partial_rotary_factor · head_dim` elements of
//! each head only (Phi-4-mini: 0.75); LongRoPE for the 128k models — per-pair frequency divisors,
//! `short_factor` within the pre-training context and `long_factor` beyond it, and an attention factor
//! on the cosines and sines; a sliding window on every layer when the config sets one below the
//! context (Phi-3-mini-4k: 2047).
//!
//! Which factors: `transformers` switches by the current sequence length and vLLM by the batch's
//! longest position, both re-rotating keys already cached with the other set; the engine decides once
//! by the context it serves (`ModelConfig::serving_context`), as llama.cpp does by its context size.
//!
//! Sources: `transformers`' `Phi3Config`, `modeling_phi3.py` and `_compute_longrope_parameters`;
//! llama.cpp's `convert_hf_to_gguf.py` (`Phi3MiniModel`) and its phi3 graph for the GGUF side.

use super::{ErrFn, check_activation, opt_f32, opt_usize};
use crate::error::{EngineError, Result};
use crate::model::config::{LongRope, ModelConfig};
use crate::model::gguf::{GgufFile, GgufValue};
use serde_json::{Map, Value, json};

pub(super) fn apply_hf(v: &Value, c: &mut ModelConfig, err: ErrFn<'_>) -> Result<()> {
    check_activation(v, &["silu"], err)?;
    c.qkv_bias = false;
    c.o_bias = false;
    let factor = match v.get("partial_rotary_factor") {
        None | Some(Value::Null) => 1.0,
        Some(x) => match x.as_f64() {
            Some(f) if f > 0.0 && f <= 1.0 => f,
            _ => return Err(err("partial_rotary_factor", format!("{x} must be in (0, 1]"))),
        },
    };
    // `int(head_dim * partial_rotary_factor)`, as `transformers` computes it.
    let rotary = (c.head_dim as f64 * factor + 1e-9).floor() as usize;
    if rotary == 0 || !rotary.is_multiple_of(2) {
        return Err(err(
            "partial_rotary_factor",
            format!(
                "{factor} gives {rotary} rotary elements of a {}-element head (must be even and non-zero)",
                c.head_dim
            ),
        ));
    }
    c.rotary_dim = rotary;
    if let Some(w) = opt_usize(v, "sliding_window", err)?
        && w < c.max_position_embeddings
    {
        c.sliding_window = Some(w);
        c.local_layers = vec![true; c.num_layers];
    }
    if let Some(scaling) = v.get("rope_scaling").filter(|x| !x.is_null()) {
        c.long_rope = long_rope(v, scaling, c, err)?;
    }
    Ok(())
}

/// LongRoPE's parameters from `rope_scaling` (`type`/`rope_type` `longrope`, or `su` as the first
/// Phi-3 128k configs name it); `None` for `default`.
fn long_rope(v: &Value, s: &Value, c: &ModelConfig, err: ErrFn<'_>) -> Result<Option<LongRope>> {
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => return Ok(None),
        "longrope" | "su" => {}
        other => {
            return Err(err(
                "rope_scaling.type",
                format!("{other:?} is not supported for Phi-3 (default, longrope, su)"),
            ));
        }
    }
    let pairs = c.rotary_dim / 2;
    let factors = |key: &str| -> Result<Vec<f32>> {
        let field = format!("rope_scaling.{key}");
        let list = s
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| err(&field, "missing (a list of numbers)".into()))?;
        if list.len() != pairs {
            return Err(err(
                &field,
                format!(
                    "has {} entries, expected {pairs} (rotary elements / 2)",
                    list.len()
                ),
            ));
        }
        list.iter()
            .map(|x| match x.as_f64() {
                Some(f) if f.is_finite() && f > 0.0 => Ok(f as f32),
                _ => Err(err(&field, format!("{x} must be a positive number"))),
            })
            .collect()
    };
    let original = match opt_usize(v, "original_max_position_embeddings", err)? {
        Some(n) => n,
        None => opt_usize(s, "original_max_position_embeddings", err)?.ok_or_else(|| {
            err(
                "original_max_position_embeddings",
                "missing (LongRoPE needs the pre-training context)".into(),
            )
        })?,
    };
    let scale = c.max_position_embeddings as f64 / original as f64;
    let attention_factor = match opt_f32(s, "attention_factor", err)? {
        Some(f) => f,
        None if scale <= 1.0 => 1.0,
        None => (1.0 + scale.ln() / (original as f64).ln()).sqrt() as f32,
    };
    Ok(Some(LongRope {
        short_factor: factors("short_factor")?,
        long_factor: factors("long_factor")?,
        original_max_position_embeddings: original,
        attention_factor,
    }))
}

/// The HF names of the Phi-3-specific GGUF layer tensors: the fused projections.
pub(super) fn gguf_tensor(part: &str) -> Option<&'static str> {
    Some(match part {
        "attn_qkv.weight" => "self_attn.qkv_proj.weight",
        // The converter keeps gate and up fused under llama.cpp's `ffn_up` (gate first).
        "ffn_up.weight" => "mlp.gate_up_proj.weight",
        _ => return None,
    })
}

/// `config.json` keys from `phi3.*` metadata and the `rope_factors_{long,short}.weight` tensors the
/// converter writes from `rope_scaling` (f32), as llama.cpp reads them.
pub(super) fn gguf_keys(g: &GgufFile, hf: &mut Map<String, Value>) -> Result<()> {
    let num = |k: &str| g.get(&format!("phi3.{k}")).and_then(GgufValue::as_f64);
    let (hidden, heads) = (num("embedding_length"), num("attention.head_count"));
    if let (Some(rot), Some(h), Some(n)) = (num("rope.dimension_count"), hidden, heads)
        && n > 0.0
    {
        let head_dim = (h / n).floor();
        hf.insert("partial_rotary_factor".into(), json!(rot / head_dim));
    }
    if let Some(w) = num("attention.sliding_window").filter(|&w| w > 0.0) {
        hf.insert("sliding_window".into(), json!(w as usize));
    }
    if let Some(o) = num("rope.scaling.original_context_length") {
        hf.insert("original_max_position_embeddings".into(), json!(o as usize));
    }
    let (Some(long), Some(short)) = (
        factors(g, "rope_factors_long.weight")?,
        factors(g, "rope_factors_short.weight")?,
    ) else {
        return Ok(());
    };
    let mut scaling = json!({"type": "longrope", "long_factor": long, "short_factor": short});
    if let Some(f) = num("rope.scaling.attn_factor") {
        scaling["attention_factor"] = json!(f);
    }
    hf.insert("rope_scaling".into(), scaling);
    Ok(())
}

/// The values of the f32 vector tensor `name`, if `g` has it.
fn factors(g: &GgufFile, name: &str) -> Result<Option<Vec<f64>>> {
    let Some(t) = g.tensors.iter().find(|t| t.name == name) else {
        return Ok(None);
    };
    let bytes = &g.map.0[t.start..t.end];
    if t.ggml_type != 0 || t.dims.len() != 1 || bytes.len() != 4 * t.dims[0] {
        return Err(EngineError::Weights {
            path: g.path.clone(),
            tensor: name.into(),
            message: format!(
                "must be an f32 vector (GGML type {}, dims {:?})",
                t.ggml_type, t.dims
            ),
        });
    }
    Ok(Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect(),
    ))
}
