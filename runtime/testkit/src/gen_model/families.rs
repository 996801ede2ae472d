//! The newer families `gen-model` writes — Qwen3, Gemma 3 (text), Qwen3-MoE, Phi-3 — and what sets
//! them apart from the Llama layout of shapes.rs: their tiny shapes, the `config.json` keys
//! `transformers` writes for each `model_type`, special tokens and chat templates, and what llama.cpp's
//! `convert_hf_to_gguf.py` (the tree vendored in llama-cpp-python 0.3.36) does for each architecture:
//! architecture string, metadata keys, tensor names, Gemma's +1 on norm weights, Phi-3's rope factors.
//!
//! Invariants: every matrix's input width is a multiple of 256, so each shape quantizes to K-quants;
//! none of these architectures has its Q/K rows permuted in GGUF (llama.cpp runs them with NEOX RoPE,
//! the Hugging Face rotate-half layout); the weights are those of weights.rs, seeded by tensor name.

use super::shapes::{Family, FamilyTokens, ModelShape, Shape};
use modelfleet_engine::model::gguf::GgufValue;
use serde_json::{Map, Value, json};

/// What a family adds to the Llama layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Extra {
    /// Plain Llama / Mistral / Qwen2.
    None,
    /// Per-head RMS norms on q and k before RoPE.
    Qwen3,
    /// q/k norms, sandwich norms, (1 + w) norm weights, a sliding window on `pattern - 1` of every
    /// `pattern` layers with its own RoPE base, GELU-tanh MLP, embeddings scaled by √hidden.
    Gemma3 {
        sliding_window: usize,
        local_rope_theta: f64,
        pattern: usize,
    },
    /// Qwen3 attention and a top-k mixture of SwiGLU experts in every layer.
    Qwen3Moe {
        experts: usize,
        top_k: usize,
        expert_ff: usize,
    },
    /// Fused qkv and gate_up projections, RoPE on the first `partial_rotary` of each head, longrope.
    Phi3 {
        partial_rotary: f64,
        original_max_pos: usize,
    },
}

/// The tiny shape of a newer family, from the tiny Llama.
pub(crate) fn spec(shape: Shape, tiny: ModelShape) -> ModelShape {
    let base = ModelShape {
        hidden: 256,
        intermediate: 512,
        heads: 4,
        kv_heads: 2,
        rope_theta: 1_000_000.0,
        tied: true,
        ..tiny
    };
    match shape {
        Shape::TinyQwen3 => ModelShape {
            architecture: "Qwen3ForCausalLM",
            model_type: "qwen3",
            family: Family::Qwen3,
            head_dim: Some(128),
            extra: Extra::Qwen3,
            ..base
        },
        Shape::TinyGemma3 => ModelShape {
            architecture: "Gemma3ForCausalLM",
            model_type: "gemma3_text",
            family: Family::Gemma,
            layers: 6,
            head_dim: Some(128),
            extra: Extra::Gemma3 {
                sliding_window: 16,
                local_rope_theta: 10_000.0,
                pattern: 6,
            },
            ..base
        },
        Shape::TinyQwen3Moe => ModelShape {
            architecture: "Qwen3MoeForCausalLM",
            model_type: "qwen3_moe",
            family: Family::Qwen3,
            tied: false,
            extra: Extra::Qwen3Moe {
                experts: 8,
                top_k: 2,
                expert_ff: 256,
            },
            ..base
        },
        Shape::Qwen3MoeBench => ModelShape {
            architecture: "Qwen3MoeForCausalLM",
            model_type: "qwen3_moe",
            family: Family::Qwen3,
            tied: false,
            hidden: 1024,
            layers: 8,
            heads: 16,
            kv_heads: 4,
            head_dim: Some(64),
            extra: Extra::Qwen3Moe {
                experts: 8,
                top_k: 2,
                expert_ff: 1024,
            },
            ..base
        },
        Shape::TinyPhi3 => {
            let rot = (64.0 * 0.75) as usize / 2;
            ModelShape {
                architecture: "Phi3ForCausalLM",
                model_type: "phi3",
                family: Family::Phi3,
                max_pos: 131_072,
                rope_theta: 10_000.0,
                // Short factors (used while the context fits the original 4096) differ from 1 so the
                // reference exercises them.
                rope_scaling: Some(json!({
                    "type": "longrope",
                    "short_factor": (0..rot).map(|i| (20 + i) as f64 / 20.0).collect::<Vec<_>>(),
                    "long_factor": (0..rot).map(|i| (2 + i) as f64 / 2.0).collect::<Vec<_>>(),
                    "original_max_position_embeddings": 4096,
                })),
                extra: Extra::Phi3 {
                    partial_rotary: 0.75,
                    original_max_pos: 4096,
                },
                ..base
            }
        }
        other => unreachable!("{other:?} is not a newer family"),
    }
}

const GEMMA: &str = "{{- bos_token }}
{%- for message in messages %}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}
{{- '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<start_of_turn>model\n' }}
{%- endif %}";

const PHI3: &str = "{%- for message in messages %}
{{- '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|assistant|>' }}
{%- endif %}";

/// Special tokens of the Gemma and Phi-3 chat formats (Gemma's first four ids as in the real vocabulary).
pub(crate) fn tokens(family: Family) -> FamilyTokens {
    match family {
        Family::Gemma => FamilyTokens {
            specials: &[
                "<pad>",
                "<eos>",
                "<bos>",
                "<unk>",
                "<start_of_turn>",
                "<end_of_turn>",
            ],
            added: &[],
            bos: "<bos>",
            prepend_bos: true,
            eos: "<eos>",
            eos_all: &["<eos>", "<end_of_turn>"],
            template: GEMMA,
        },
        Family::Phi3 => FamilyTokens {
            specials: &[
                "<|endoftext|>",
                "<|system|>",
                "<|user|>",
                "<|assistant|>",
                "<|end|>",
            ],
            added: &[],
            bos: "<|endoftext|>",
            prepend_bos: false,
            eos: "<|end|>",
            eos_all: &["<|end|>", "<|endoftext|>"],
            template: PHI3,
        },
        _ => unreachable!("shapes.rs has the other families"),
    }
}

/// The family's `config.json` keys beyond the Llama ones (and without those it lacks).
pub(crate) fn adjust_config(s: &ModelShape, o: &mut Map<String, Value>) {
    let mut set = |pairs: Vec<(&str, Value)>| {
        for (k, v) in pairs {
            o.insert(k.into(), v);
        }
    };
    match s.extra {
        Extra::None => return,
        Extra::Qwen3 | Extra::Qwen3Moe { .. } => set(vec![
            ("attention_dropout", json!(0.0)),
            ("max_window_layers", json!(s.layers)),
            ("sliding_window", Value::Null),
            ("use_sliding_window", json!(false)),
            ("use_cache", json!(true)),
        ]),
        Extra::Gemma3 {
            sliding_window,
            local_rope_theta,
            pattern,
        } => set(vec![
            ("hidden_activation", json!("gelu_pytorch_tanh")),
            ("query_pre_attn_scalar", json!(s.head_dim())),
            ("sliding_window", json!(sliding_window)),
            ("_sliding_window_pattern", json!(pattern)),
            (
                "layer_types",
                json!(
                    (0..s.layers)
                        .map(|i| if (i + 1) % pattern != 0 {
                            "sliding_attention"
                        } else {
                            "full_attention"
                        })
                        .collect::<Vec<_>>()
                ),
            ),
            ("rope_local_base_freq", json!(local_rope_theta)),
            ("final_logit_softcapping", Value::Null),
            ("attn_logit_softcapping", Value::Null),
            ("attention_dropout", json!(0.0)),
            ("pad_token_id", json!(0)),
            ("use_bidirectional_attention", json!(false)),
            ("use_cache", json!(true)),
        ]),
        Extra::Phi3 {
            partial_rotary,
            original_max_pos,
        } => set(vec![
            ("partial_rotary_factor", json!(partial_rotary)),
            ("original_max_position_embeddings", json!(original_max_pos)),
            ("attention_dropout", json!(0.0)),
            ("embd_pdrop", json!(0.0)),
            ("resid_pdrop", json!(0.0)),
            ("sliding_window", Value::Null),
            ("pad_token_id", json!(0)),
            ("use_cache", json!(true)),
        ]),
    }
    if let Extra::Qwen3Moe {
        experts,
        top_k,
        expert_ff,
    } = s.extra
    {
        set(vec![
            ("decoder_sparse_step", json!(1)),
            ("moe_intermediate_size", json!(expert_ff)),
            ("num_experts", json!(experts)),
            ("num_experts_per_tok", json!(top_k)),
            ("norm_topk_prob", json!(true)),
            ("output_router_logits", json!(false)),
            ("router_aux_loss_coef", json!(0.001)),
            ("mlp_only_layers", json!([])),
        ]);
    }
    o.remove("mlp_bias");
    match s.extra {
        Extra::Gemma3 { .. } => {
            o.remove("hidden_act");
        }
        // Phi-3 has no `head_dim` key: it is always hidden / heads.
        Extra::Phi3 { .. } => {
            o.remove("head_dim");
        }
        _ => {}
    }
}

/// llama.cpp's architecture name of a model type.
pub(crate) fn gguf_arch(model_type: &str) -> &'static str {
    match model_type {
        "qwen2" => "qwen2",
        "qwen3" => "qwen3",
        "qwen3_moe" => "qwen3moe",
        "gemma3_text" => "gemma3",
        "phi3" => "phi3",
        _ => "llama",
    }
}

/// The family's GGUF metadata beyond the keys every architecture gets, as the converter writes it;
/// `rope.dimension_count` is among these (the converter writes it for Llama and Phi-3 only).
pub(crate) fn gguf_meta(s: &ModelShape, k: &dyn Fn(&str) -> String) -> Vec<(String, GgufValue)> {
    let u = |v: usize| GgufValue::U64(v as u64);
    let hd = s.head_dim();
    let key_len = vec![
        (k("attention.key_length"), u(hd)),
        (k("attention.value_length"), u(hd)),
    ];
    match s.extra {
        Extra::None => vec![(k("rope.dimension_count"), u(hd))],
        Extra::Qwen3 => key_len,
        Extra::Qwen3Moe {
            experts,
            top_k,
            expert_ff,
        } => {
            let mut m = vec![
                (k("expert_count"), u(experts)),
                (k("expert_used_count"), u(top_k)),
            ];
            m.extend(key_len);
            m.push((k("expert_feed_forward_length"), u(expert_ff)));
            m
        }
        Extra::Gemma3 {
            sliding_window,
            local_rope_theta,
            ..
        } => {
            let mut m = key_len;
            m.push((k("attention.sliding_window"), u(sliding_window)));
            m.push((k("rope.freq_base_swa"), GgufValue::F64(local_rope_theta)));
            m.push(("tokenizer.ggml.padding_token_id".into(), u(0)));
            m
        }
        Extra::Phi3 {
            partial_rotary,
            original_max_pos,
        } => {
            let scale = s.max_pos as f64 / original_max_pos as f64;
            let attn_factor = (1.0 + scale.ln() / (original_max_pos as f64).ln()).sqrt();
            vec![
                (k("rope.scaling.original_context_length"), u(original_max_pos)),
                (k("rope.dimension_count"), u(rotary_dim(s, partial_rotary))),
                (k("attention.sliding_window"), u(0)),
                (k("rope.scaling.attn_factor"), GgufValue::F64(attn_factor)),
            ]
        }
    }
}

/// Phi-3's rotary width: `int(partial_rotary_factor * hidden) // heads`, as the converter computes it.
fn rotary_dim(s: &ModelShape, partial_rotary: f64) -> usize {
    (partial_rotary * s.hidden as f64) as usize / s.heads
}

/// The llama.cpp name of a layer tensor's part (`self_attn.q_norm.weight` → `attn_q_norm.weight`).
pub(crate) fn gguf_part(s: &ModelShape, part: &str) -> Option<&'static str> {
    let gemma = matches!(s.extra, Extra::Gemma3 { .. });
    Some(match part {
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "post_attention_layernorm.weight" if gemma => "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
        "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
        "self_attn.qkv_proj.weight" => "attn_qkv.weight",
        "mlp.gate_up_proj.weight" => "ffn_up.weight",
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        "mlp.experts.gate_proj.weight" => "ffn_gate_exps.weight",
        "mlp.experts.up_proj.weight" => "ffn_up_exps.weight",
        "mlp.experts.down_proj.weight" => "ffn_down_exps.weight",
        _ => return None,
    })
}

/// What the converter adds to a tensor's values: Gemma 3's RMSNorm computes `x * (1 + w)`, so every
/// `*norm.weight` (the four sandwich norms, q/k norms, the final norm) gets +1.
pub(crate) fn norm_shift(s: &ModelShape, hf_name: &str) -> f32 {
    if matches!(s.extra, Extra::Gemma3 { .. }) && hf_name.ends_with("norm.weight") {
        1.0
    } else {
        0.0
    }
}

/// Tensors the converter generates from the config: Phi-3's `rope_factors_long.weight` and
/// `rope_factors_short.weight` (f32, rotary_dim / 2 each, in that order).
pub(crate) fn generated_tensors(s: &ModelShape) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let (Extra::Phi3 { .. }, Some(scaling)) = (s.extra, &s.rope_scaling) else {
        return Vec::new();
    };
    let list = |key: &str| -> Vec<f32> {
        scaling[key]
            .as_array()
            .expect("factor list")
            .iter()
            .map(|v| v.as_f64().expect("a number") as f32)
            .collect()
    };
    ["long", "short"]
        .iter()
        .map(|w| {
            let v = list(&format!("{w}_factor"));
            (format!("rope_factors_{w}.weight"), vec![v.len()], v)
        })
        .collect()
}

/// Tensors kept in f32 whatever the dtype (besides 1-D ones): the MoE router, as the converter does.
pub(crate) fn keep_f32(gguf_name: &str) -> bool {
    gguf_name.ends_with("ffn_gate_inp.weight")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_have_each_families_keys() {
        let cases: [(Shape, &[&str]); 4] = [
            (
                Shape::TinyQwen3,
                &["head_dim", "rms_norm_eps", "tie_word_embeddings"],
            ),
            (
                Shape::TinyGemma3,
                &[
                    "hidden_activation",
                    "query_pre_attn_scalar",
                    "sliding_window",
                    "layer_types",
                    "rope_local_base_freq",
                    "_sliding_window_pattern",
                ],
            ),
            (
                Shape::TinyQwen3Moe,
                &[
                    "num_experts",
                    "num_experts_per_tok",
                    "moe_intermediate_size",
                    "norm_topk_prob",
                    "decoder_sparse_step",
                    "mlp_only_layers",
                ],
            ),
            (
                Shape::TinyPhi3,
                &[
                    "partial_rotary_factor",
                    "rope_scaling",
                    "original_max_position_embeddings",
                ],
            ),
        ];
        for (shape, keys) in cases {
            let s = shape.spec();
            let text = s.config_json("float32").to_string();
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["model_type"], s.model_type);
            assert_eq!(v["architectures"][0], s.architecture);
            for key in keys {
                assert!(v.get(*key).is_some_and(|x| !x.is_null()), "{shape:?}: {key}");
            }
            // Every matrix input width is a multiple of the K-quant block.
            for w in [s.hidden, s.intermediate, s.heads * s.head_dim()] {
                assert_eq!(w % 256, 0, "{shape:?}: {w}");
            }
        }
        let g = Shape::TinyGemma3.spec().config_json("float32");
        let kinds: Vec<&str> = g["layer_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert_eq!(kinds[4], "sliding_attention");
        assert_eq!(kinds[5], "full_attention");
        assert!(g.get("hidden_act").is_none());
        let p = Shape::TinyPhi3.spec().config_json("float32");
        assert_eq!(p["rope_scaling"]["short_factor"].as_array().unwrap().len(), 24);
        assert!(p.get("head_dim").is_none());
    }

    #[test]
    fn each_shape_writes_both_formats_with_the_converters_names() {
        use crate::gen_model::{GenDType, GenFormat, GenModelOptions, gen_model};
        use modelfleet_engine::model::gguf::GgufFile;
        for (shape, arch, expect) in [
            (
                Shape::TinyQwen3,
                "qwen3",
                &["blk.1.attn_q_norm.weight", "blk.0.attn_k_norm.weight"][..],
            ),
            (
                Shape::TinyGemma3,
                "gemma3",
                &[
                    "blk.5.post_attention_norm.weight",
                    "blk.0.post_ffw_norm.weight",
                    "blk.0.ffn_norm.weight",
                ],
            ),
            (
                Shape::TinyQwen3Moe,
                "qwen3moe",
                &[
                    "blk.1.ffn_gate_exps.weight",
                    "blk.0.ffn_gate_inp.weight",
                    "output.weight",
                ],
            ),
            (
                Shape::TinyPhi3,
                "phi3",
                &[
                    "blk.0.attn_qkv.weight",
                    "rope_factors_short.weight",
                    "rope_factors_long.weight",
                ],
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let st = dir.path().join("st");
            let opts = |dtype, format| GenModelOptions {
                shape,
                seed: 3,
                dtype,
                format,
            };
            gen_model(&st, &opts(GenDType::F16, GenFormat::Safetensors)).unwrap();
            let cfg: Value = serde_json::from_slice(&std::fs::read(st.join("config.json")).unwrap()).unwrap();
            assert_eq!(cfg["model_type"], shape.spec().model_type);
            assert!(st.join("model.safetensors").is_file());
            for dtype in [GenDType::F16, GenDType::Q4K] {
                let g = dir.path().join(format!("{dtype:?}"));
                gen_model(&g, &opts(dtype, GenFormat::Gguf)).unwrap();
                let f = GgufFile::open(&g.join("model.gguf")).unwrap();
                assert_eq!(f.get("general.architecture").and_then(|v| v.as_str()), Some(arch));
                for name in expect {
                    assert!(f.tensors.iter().any(|t| t.name == *name), "{shape:?}: no {name}");
                }
            }
        }
        // The experts stack into [hidden, expert_ff, experts]; Gemma's norms carry the +1.
        let dir = tempfile::tempdir().unwrap();
        let o = |shape| GenModelOptions {
            shape,
            seed: 3,
            dtype: GenDType::F32,
            format: GenFormat::Gguf,
        };
        gen_model(dir.path(), &o(Shape::TinyQwen3Moe)).unwrap();
        let f = GgufFile::open(&dir.path().join("model.gguf")).unwrap();
        let t = f
            .tensors
            .iter()
            .find(|t| t.name == "blk.0.ffn_down_exps.weight")
            .unwrap();
        assert_eq!(t.dims, vec![256, 256, 8]);
        let r = f
            .tensors
            .iter()
            .find(|t| t.name == "blk.0.ffn_gate_inp.weight")
            .unwrap();
        assert_eq!(r.ggml_type, 0);
    }
}
