//! A GGUF file as a model: llama.cpp's metadata keys mapped to a [`ModelConfig`] and its tensor names
//! (`blk.N.attn_q.weight`, …) mapped to Hugging Face's, so [`super::Decoder::load`] runs GGUF and
//! safetensors models alike; each family's own keys and names are in `model::family`.
//!
//! Invariants: the config goes through the same validation as `config.json` (a missing key is reported
//! by its GGUF name); GGUF's `llama` architecture stores Q/K rows permuted for GGML's adjacent-pair
//! RoPE (`convert_hf_to_gguf.py`'s `LlamaModel.permute`), so such models get `rope_interleaved` — the
//! attention scores are unchanged because Q and K are permuted alike; `qwen2`, `qwen3` and `gemma3`
//! files are not permuted (llama.cpp runs them with NEOX RoPE). Gemma's RMSNorm weights already have
//! the 1 added, so such models do not get `norm_weight_offset`.
//! Tensors of unsupported GGML types are only an error if the model uses them.

use super::config::ModelConfig;
use super::family;
use super::gguf::{GgufFile, GgufValue, ggml_dtype};
use super::weights::{Entry, Weights};
use crate::error::{EngineError, Result};
use serde_json::json;

/// The llama.cpp tensor name → the Hugging Face one, in architecture `arch`.
pub(crate) fn hf_name(arch: &str, gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        "rope_freqs.weight" => Some("rope_freqs.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf = family::gguf_layer_tensor(arch, part)?;
    Some(format!("model.layers.{layer}.{hf}"))
}

/// `general.architecture` of `g`.
fn arch(g: &GgufFile) -> Option<&str> {
    g.get("general.architecture").and_then(GgufValue::as_str)
}

/// The tensors of `g` under Hugging Face names and shapes.
pub(crate) fn weights(g: &GgufFile) -> Weights {
    let entries = g
        .tensors
        .iter()
        .filter_map(|t| {
            let name = hf_name(arch(g).unwrap_or(""), &t.name)?;
            let shape: Vec<usize> = t.dims.iter().rev().copied().collect();
            Some((name, Entry::new(t.start, t.end, ggml_dtype(t.ggml_type), shape)))
        })
        .collect();
    Weights::from_entries(&g.path, g.map.clone(), entries)
}

/// The model configuration of `g`.
pub(crate) fn config(g: &GgufFile) -> Result<ModelConfig> {
    let err = |field: &str, message: String| EngineError::Config {
        path: g.path.clone(),
        field: field.to_string(),
        message,
    };
    let arch = g
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| err("general.architecture", "missing".into()))?;
    let mut extra = serde_json::Map::new();
    let Some((hf_arch, interleaved)) = family::gguf_family(g, arch, &mut extra)? else {
        return Err(err(
            "general.architecture",
            format!(
                "{arch:?} is not supported ({})",
                family::GGUF_SUPPORTED.join(", ")
            ),
        ));
    };
    let key = |k: &str| format!("{arch}.{k}");
    let num = |k: &str| -> Result<Option<f64>> {
        match g.get(&key(k)) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| err(&key(k), "must be a number".into())),
        }
    };
    let required = |k: &str| -> Result<f64> { num(k)?.ok_or_else(|| err(&key(k), "missing".into())) };
    let tokens = g
        .get("tokenizer.ggml.tokens")
        .and_then(GgufValue::as_array)
        .map(<[GgufValue]>::len);
    let embd_rows = g
        .tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .and_then(|t| t.dims.get(1).copied());
    let vocab = num("vocab_size")?
        .map(|v| v as usize)
        .or(embd_rows)
        .or(tokens)
        .ok_or_else(|| err(&key("vocab_size"), "missing".into()))?;
    let heads = required("attention.head_count")?;
    let hidden = required("embedding_length")?;
    let rope_scaling = match g.get(&key("rope.scaling.type")).and_then(GgufValue::as_str) {
        None | Some("none") => serde_json::Value::Null,
        Some("linear") => json!({"type": "linear", "factor": required("rope.scaling.factor")?}),
        Some(other) => {
            return Err(err(
                &key("rope.scaling.type"),
                format!("{other:?} is not supported (none, linear)"),
            ));
        }
    };
    let id = |k: &str| g.get(k).and_then(GgufValue::as_u64);
    let mut hf = json!({
        "architectures": [hf_arch],
        "hidden_size": hidden as usize,
        "intermediate_size": required("feed_forward_length")? as usize,
        "num_hidden_layers": required("block_count")? as usize,
        "num_attention_heads": heads as usize,
        "num_key_value_heads": num("attention.head_count_kv")?.unwrap_or(heads) as usize,
        "head_dim": num("attention.key_length")?.map_or(hidden as usize / (heads as usize).max(1), |v| v as usize),
        "vocab_size": vocab,
        "max_position_embeddings": required("context_length")? as usize,
        "rms_norm_eps": required("attention.layer_norm_rms_epsilon")?,
        "rope_theta": num("rope.freq_base")?.unwrap_or(10_000.0),
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": !g.tensors.iter().any(|t| t.name == "output.weight"),
        "bos_token_id": id("tokenizer.ggml.bos_token_id"),
        "eos_token_id": id("tokenizer.ggml.eos_token_id"),
    });
    if let Some(obj) = hf.as_object_mut() {
        obj.extend(extra);
    }
    let mut config = ModelConfig::from_json(&g.path, &hf.to_string())?;
    config.rope_interleaved = interleaved;
    config.norm_weight_offset = false;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_names_map_to_hugging_face() {
        for (g, hf) in [
            ("token_embd.weight", Some("model.embed_tokens.weight")),
            (
                "blk.12.attn_q.weight",
                Some("model.layers.12.self_attn.q_proj.weight"),
            ),
            ("blk.0.attn_k.bias", Some("model.layers.0.self_attn.k_proj.bias")),
            (
                "blk.3.ffn_down.weight",
                Some("model.layers.3.mlp.down_proj.weight"),
            ),
            ("blk.x.ffn_down.weight", None),
            (
                "blk.1.attn_q_norm.weight",
                Some("model.layers.1.self_attn.q_norm.weight"),
            ),
            ("blk.1.post_ffw_norm.weight", None),
        ] {
            assert_eq!(hf_name("llama", g).as_deref(), hf, "{g}");
        }
        // Gemma's norms: its `ffn_norm` is the pre-FFN norm of a sandwich, not Llama's post-attention one.
        for (g, hf) in [
            (
                "blk.2.ffn_norm.weight",
                "model.layers.2.pre_feedforward_layernorm.weight",
            ),
            (
                "blk.2.post_attention_norm.weight",
                "model.layers.2.post_attention_layernorm.weight",
            ),
            (
                "blk.2.post_ffw_norm.weight",
                "model.layers.2.post_feedforward_layernorm.weight",
            ),
            ("blk.2.attn_norm.weight", "model.layers.2.input_layernorm.weight"),
        ] {
            assert_eq!(hf_name("gemma3", g).as_deref(), Some(hf), "{g}");
        }
    }
}
