//! What varies between model families, decided once when the config is read: each family's file turns
//! the keys of its `config.json` into [`ModelConfig`]'s feature fields (q/k norms, sandwich norms, the
//! activation, sliding windows and local RoPE, embedding scale, softcapping, experts), and names the
//! tensors its GGUF files spell differently. The decoder (`model::decoder`) then runs every family with
//! one layer loop; nothing downstream matches on the architecture.
//!
//! A new family: add its `Architecture` variant and `config.json` names in `config.rs`, a file here
//! with its `apply_hf` (and `gguf_keys`/`gguf_tensor` if llama.cpp has it), and a tiny shape in
//! `gen-model` (runtime/testkit) so the reference tests cover it.

mod gemma3;
mod llama;
mod phi3;
mod qwen3;
mod qwen3moe;

use super::config::{Architecture, ModelConfig};
use super::gguf::GgufFile;
use crate::error::{EngineError, Result};
use serde_json::{Map, Value};

/// Builds a config error naming a `config.json` field.
pub(crate) type ErrFn<'a> = &'a dyn Fn(&str, String) -> EngineError;

/// Applies the family-specific keys of `config.json` (`v`) to `c`.
pub(crate) fn apply_hf(v: &Value, c: &mut ModelConfig, err: ErrFn<'_>) -> Result<()> {
    match c.architecture {
        Architecture::Llama | Architecture::Mistral | Architecture::Qwen2 => llama::apply_hf(v, c, err),
        Architecture::Qwen3 => qwen3::apply_hf(v, c, err),
        Architecture::Qwen3Moe => qwen3moe::apply_hf(v, c, err),
        Architecture::Gemma3 => gemma3::apply_hf(v, c, err),
        Architecture::Phi3 => phi3::apply_hf(v, c, err),
    }
}

/// A GGUF file's family: the Hugging Face architecture name, whether its converter permuted the Q/K
/// rows for GGML's adjacent-pair RoPE, and the family's own `config.json` keys read from its metadata
/// (added to `hf`).
pub(crate) fn gguf_family(
    g: &GgufFile,
    arch: &str,
    hf: &mut Map<String, Value>,
) -> Result<Option<(&'static str, bool)>> {
    Ok(Some(match arch {
        "llama" => ("LlamaForCausalLM", true),
        "qwen2" => ("Qwen2ForCausalLM", false),
        "qwen3" => ("Qwen3ForCausalLM", false),
        "qwen3moe" => {
            qwen3moe::gguf_keys(g, hf)?;
            ("Qwen3MoeForCausalLM", false)
        }
        "gemma3" => {
            gemma3::gguf_keys(g, hf)?;
            ("Gemma3ForCausalLM", false)
        }
        "phi3" => {
            phi3::gguf_keys(g, hf)?;
            ("Phi3ForCausalLM", false)
        }
        _ => return Ok(None),
    }))
}

/// The GGUF architectures the engine reads.
pub(crate) const GGUF_SUPPORTED: [&str; 6] = ["llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3"];

/// The Hugging Face name of a per-layer GGUF tensor `part` (`attn_q.weight`, …) in architecture `arch`.
pub(crate) fn gguf_layer_tensor(arch: &str, part: &str) -> Option<&'static str> {
    if arch == "gemma3"
        && let Some(name) = gemma3::gguf_tensor(part)
    {
        return Some(name);
    }
    if arch == "qwen3moe"
        && let Some(name) = qwen3moe::gguf_tensor(part)
    {
        return Some(name);
    }
    if arch == "phi3"
        && let Some(name) = phi3::gguf_tensor(part)
    {
        return Some(name);
    }
    Some(match part {
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_q.bias" => "self_attn.q_proj.bias",
        "attn_k.bias" => "self_attn.k_proj.bias",
        "attn_v.bias" => "self_attn.v_proj.bias",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_output.bias" => "self_attn.o_proj.bias",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    })
}

/// `v[key]` as a positive integer, if present and not null.
pub(crate) fn opt_usize(v: &Value, key: &str, err: ErrFn<'_>) -> Result<Option<usize>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_u64() {
            Some(n) if n > 0 => Ok(Some(n as usize)),
            _ => Err(err(key, format!("{x} must be a positive integer or null"))),
        },
    }
}

/// `v[key]` as a positive finite number, if present and not null.
pub(crate) fn opt_f32(v: &Value, key: &str, err: ErrFn<'_>) -> Result<Option<f32>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_f64() {
            Some(n) if n.is_finite() && n > 0.0 => Ok(Some(n as f32)),
            _ => Err(err(key, format!("{x} must be a positive number or null"))),
        },
    }
}

/// Refuses an activation other than `want` (under `hidden_act` or `hidden_activation`).
pub(crate) fn check_activation(v: &Value, want: &[&str], err: ErrFn<'_>) -> Result<()> {
    for key in ["hidden_act", "hidden_activation"] {
        if let Some(act) = v.get(key).and_then(Value::as_str)
            && !want.contains(&act)
        {
            return Err(err(
                key,
                format!("{act:?} is not supported (this family: {})", want.join(", ")),
            ));
        }
    }
    Ok(())
}
