//! `gen-model --format gguf`: the same random model as the safetensors output (same seeds, same
//! values), written as one llama.cpp GGUF file with its tokenizer and chat template in the metadata,
//! optionally quantized (Q8_0, Q4_0, Q4_K).
//!
//! Invariants: tensors follow `convert_hf_to_gguf.py` — llama.cpp names, dims innermost first, Q/K rows
//! of the `llama` architecture permuted for GGML's adjacent-pair RoPE (`convert_hf_to_gguf.py`'s `LlamaModel.permute`), norms and
//! biases kept in f32, llama3 RoPE scaling written as the `rope_freqs.weight` divisors; for the newer
//! families (families.rs) their metadata, Gemma's +1 on norm weights, Qwen3-MoE's experts stacked into
//! one 3-D tensor per projection, Phi-3's rope factor tensors — so an f32 GGUF and the safetensors model
//! describe the same function.

use super::families;
use super::shapes::{Family, ModelShape};
use super::weights::LazyTensor;
use super::{GenDType, GenModelError};
use modelfleet_engine::kernels::quant::{quantize_q4_0, quantize_q8_0};
use modelfleet_engine::model::ModelConfig;
use modelfleet_engine::model::gguf::GgufValue;
use modelfleet_engine::model::gguf::writer::{TensorHeader, write};
use serde_json::Value;
use std::path::Path;

/// GGML type ids and `general.file_type` values.
fn ggml_type(dtype: GenDType) -> (u32, u32) {
    match dtype {
        GenDType::F32 => (0, 0),
        GenDType::F16 => (1, 1),
        GenDType::Bf16 => (30, 32),
        GenDType::Q8_0 => (8, 7),
        GenDType::Q4_0 => (2, 2),
        // LLAMA_FTYPE_MOSTLY_Q4_K_S: every matrix Q4_K (llama-quantize's Q4_K_S keeps a few in Q5/Q6_K).
        GenDType::Q4K => (12, 14),
    }
}

fn encode(values: &[f32], ggml: u32) -> Vec<u8> {
    match ggml {
        1 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        30 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        8 => quantize_q8_0(values),
        2 => quantize_q4_0(values),
        12 => quantize_q4_k(values),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// GGML Q4_K blocks of `values` (a multiple of 256 long), by candle's quantizer.
fn quantize_q4_k(values: &[f32]) -> Vec<u8> {
    use candle_core::quantized::{GgmlDType, QTensor};
    let t = candle_core::Tensor::from_slice(values, values.len(), &candle_core::Device::Cpu)
        .expect("a CPU tensor");
    let q = QTensor::quantize(&t, GgmlDType::Q4K).expect("row widths are multiples of 256");
    q.data().expect("CPU data").into_owned()
}

fn row_bytes(ggml: u32, cols: usize) -> usize {
    match ggml {
        1 | 30 => 2 * cols,
        8 => cols / 32 * 34,
        2 => cols / 32 * 18,
        12 => cols / 256 * 144,
        _ => 4 * cols,
    }
}

/// The llama.cpp name of a Hugging Face tensor (experts by their merged name, without the index).
fn gguf_name(shape: &ModelShape, hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").expect("a layer tensor");
    let (layer, part) = rest.split_once('.').expect("layer.part");
    let merged = merged_expert_part(part);
    if let Some(g) = families::gguf_part(shape, merged.as_deref().unwrap_or(part)) {
        return format!("blk.{layer}.{g}");
    }
    let part = match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        other => other,
    };
    format!("blk.{layer}.{part}")
}

/// `mlp.experts.E.W.weight` → `mlp.experts.W.weight` (the converter's name of the stacked tensor).
fn merged_expert_part(part: &str) -> Option<String> {
    let rest = part.strip_prefix("mlp.experts.")?;
    let (_, w) = rest.split_once('.')?;
    Some(format!("mlp.experts.{w}"))
}

/// The expert index of `model.layers.L.mlp.experts.E.W.weight`.
fn expert_index(hf: &str) -> Option<usize> {
    let (_, rest) = hf.split_once(".mlp.experts.")?;
    rest.split_once('.')?.0.parse().ok()
}

/// `convert_hf_to_gguf.py`'s `permute`: within each head, rows `(s, i)` move to `(i, s)`.
fn permute_rows(values: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = values.len() / cols;
    let hd = rows / heads;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for s in 0..2 {
            for i in 0..hd / 2 {
                let (from, to) = (h * hd + s * hd / 2 + i, h * hd + 2 * i + s);
                out[to * cols..(to + 1) * cols].copy_from_slice(&values[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

/// Tokens (by id) and merges of a `tokenizer.json`.
fn vocabulary(tokenizer_json: &str) -> Result<(Vec<String>, Vec<String>), GenModelError> {
    let bad = |m: &str| GenModelError::Tokenizer(m.to_string());
    let v: Value =
        serde_json::from_str(tokenizer_json).map_err(|e| GenModelError::Tokenizer(e.to_string()))?;
    let vocab = v["model"]["vocab"]
        .as_object()
        .ok_or_else(|| bad("no model.vocab"))?;
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, id) in vocab {
        let id = id.as_u64().ok_or_else(|| bad("non-integer id"))? as usize;
        *tokens.get_mut(id).ok_or_else(|| bad("id out of range"))? = t.clone();
    }
    let merges = v["model"]["merges"]
        .as_array()
        .ok_or_else(|| bad("no model.merges"))?
        .iter()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(p) if p.len() == 2 => Ok(format!(
                "{} {}",
                p[0].as_str().unwrap_or(""),
                p[1].as_str().unwrap_or("")
            )),
            _ => Err(bad("malformed merge")),
        })
        .collect::<Result<_, _>>()?;
    Ok((tokens, merges))
}

/// Writes `dir/model.gguf`.
pub(crate) fn write_gguf(
    path: &Path,
    shape: &ModelShape,
    tensors: Vec<(String, LazyTensor)>,
    tokenizer_json: &str,
    dtype: GenDType,
) -> Result<(), GenModelError> {
    let (ggml, file_type) = ggml_type(dtype);
    let arch = families::gguf_arch(shape.model_type);
    let hd = shape.head_dim();
    let fam = shape.family.tokens();
    let id = |s: &str| fam.specials.iter().position(|x| *x == s).expect("special token") as u64;
    let (tokens, merges) = vocabulary(tokenizer_json)?;
    let types: Vec<GgufValue> = (0..tokens.len())
        .map(|i| {
            // Control tokens 3, user-defined (plain added) tokens 4, as llama.cpp's converter writes.
            let ty = if i < fam.specials.len() {
                3
            } else if fam.added.contains(&tokens[i].as_str()) {
                4
            } else {
                1
            };
            GgufValue::I64(ty)
        })
        .collect();
    let k = |s: &str| format!("{arch}.{s}");
    let u = |v: usize| GgufValue::U64(v as u64);
    let mut meta: Vec<(String, GgufValue)> = vec![
        ("general.architecture".into(), GgufValue::Str(arch.into())),
        (
            "general.name".into(),
            // llama.cpp's vocabulary loader special-cases names containing "phi3"/"phi-3" (it then
            // needs the SentencePiece tokens <s>, </s>, <unk>); a Phi-4-mini style name avoids that.
            GgufValue::Str(if shape.model_type == "phi3" {
                "modelfleet random phi (Phi-4-mini layout)".into()
            } else {
                format!("modelfleet random {}", shape.model_type)
            }),
        ),
        ("general.file_type".into(), GgufValue::U64(file_type as u64)),
        (k("context_length"), u(shape.max_pos)),
        (k("embedding_length"), u(shape.hidden)),
        (k("block_count"), u(shape.layers)),
        (k("feed_forward_length"), u(shape.intermediate)),
        (k("attention.head_count"), u(shape.heads)),
        (k("attention.head_count_kv"), u(shape.kv_heads)),
        (
            k("attention.layer_norm_rms_epsilon"),
            GgufValue::F64(shape.rms_eps()),
        ),
        (k("rope.freq_base"), GgufValue::F64(shape.rope_theta)),
    ];
    meta.extend(families::gguf_meta(shape, &k));
    meta.extend(vec![
        (k("vocab_size"), u(shape.vocab)),
        ("tokenizer.ggml.model".into(), GgufValue::Str("gpt2".into())),
        ("tokenizer.ggml.pre".into(), GgufValue::Str("gpt-2".into())),
        (
            "tokenizer.ggml.tokens".into(),
            GgufValue::Array(tokens.into_iter().map(GgufValue::Str).collect()),
        ),
        ("tokenizer.ggml.token_type".into(), GgufValue::Array(types)),
        (
            "tokenizer.ggml.merges".into(),
            GgufValue::Array(merges.into_iter().map(GgufValue::Str).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), GgufValue::U64(id(fam.bos))),
        ("tokenizer.ggml.eos_token_id".into(), GgufValue::U64(id(fam.eos))),
        (
            "tokenizer.ggml.add_bos_token".into(),
            GgufValue::Bool(fam.prepend_bos),
        ),
        (
            "tokenizer.chat_template".into(),
            GgufValue::Str(fam.template.into()),
        ),
    ]);
    if shape.family == Family::Llama3 {
        meta.push((
            "tokenizer.ggml.eot_token_id".into(),
            GgufValue::U64(id("<|eot_id|>")),
        ));
    }
    // llama3 RoPE scaling as frequency divisors (what llama.cpp's converter writes).
    let mut extra = families::generated_tensors(shape);
    if shape.rope_scaling.is_some() && shape.model_type == "llama" {
        let cfg = ModelConfig::from_json(
            Path::new("config.json"),
            &shape.config_json("float32").to_string(),
        )
        .map_err(|e| GenModelError::Tokenizer(e.to_string()))?;
        let scaled = cfg.inv_freq();
        let base: Vec<f32> = (0..hd)
            .step_by(2)
            .map(|i| 1.0 / (shape.rope_theta as f32).powf(i as f32 / hd as f32))
            .collect();
        extra.push((
            "rope_freqs.weight".into(),
            vec![hd / 2],
            base.iter().zip(&scaled).map(|(b, s)| b / s).collect(),
        ));
    }
    // GGUF tensors in the converter's order, each made of one HF tensor or (experts) a stack of them.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, (name, _)) in tensors.iter().enumerate() {
        match expert_index(name) {
            None => groups.push(vec![i]),
            Some(0) => {
                let layer_part = gguf_name(shape, name);
                groups.push(
                    (0..tensors.len())
                        .filter(|j| {
                            expert_index(&tensors[*j].0).is_some()
                                && gguf_name(shape, &tensors[*j].0) == layer_part
                        })
                        .collect(),
                );
            }
            Some(_) => {}
        }
    }
    let mut headers = Vec::new();
    for g in &groups {
        let (name, t) = &tensors[g[0]];
        let mut dims: Vec<usize> = t.dims().iter().rev().copied().collect();
        if g.len() > 1 {
            dims.push(g.len());
        }
        let gname = gguf_name(shape, name);
        let ty = if dims.len() == 1 || families::keep_f32(&gname) {
            0
        } else {
            ggml
        };
        let rows: usize = dims.iter().skip(1).product();
        headers.push(TensorHeader {
            name: gname,
            dims,
            ggml_type: ty,
            len: rows * row_bytes(ty, t.dims()[t.dims().len() - 1]),
        });
    }
    for (name, dims, _) in &extra {
        headers.push(TensorHeader {
            name: name.clone(),
            dims: dims.clone(),
            ggml_type: 0,
            len: 4 * dims[0],
        });
    }
    let file = std::fs::File::create(path).map_err(|e| GenModelError::Write {
        path: path.into(),
        message: e.to_string(),
    })?;
    let mut sink = std::io::BufWriter::new(file);
    let n = groups.len();
    write(&mut sink, &meta, &headers, |i| {
        if i >= n {
            return encode(&extra[i - n].2, 0);
        }
        let mut values = Vec::new();
        for &j in &groups[i] {
            values.extend(tensors[j].1.values());
        }
        let (name, t) = &tensors[groups[i][0]];
        let cols = t.dims()[t.dims().len() - 1];
        if arch == "llama" && name.ends_with("q_proj.weight") {
            values = permute_rows(&values, shape.heads, cols);
        } else if arch == "llama" && name.ends_with("k_proj.weight") {
            values = permute_rows(&values, shape.kv_heads, cols);
        }
        let shift = families::norm_shift(shape, name);
        if shift != 0.0 {
            values.iter_mut().for_each(|v| *v += shift);
        }
        encode(&values, headers[i].ggml_type)
    })
    .and_then(|()| std::io::Write::flush(&mut sink))
    .map_err(|e| GenModelError::Write {
        path: path.into(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_interleaves_the_halves_of_each_head() {
        // 2 heads of 4 rows, 1 column: rows (h, s, i) -> (h, i, s).
        let v: Vec<f32> = (0..8).map(|x| x as f32).collect();
        assert_eq!(
            permute_rows(&v, 2, 1),
            vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
        );
    }
}
