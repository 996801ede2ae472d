//! The model shapes `gen-model` writes: real architectures' tensor shapes (SmolLM2-135M, Llama-3.2-1B)
//! and a tiny model per supported architecture, with each family's special tokens and chat template.
//!
//! Invariants: a shape's `config.json` parses with the engine's `ModelConfig` and with the
//! `transformers`/`candle-transformers` config readers (tested in `runtime/engine/tests/reference.rs`);
//! special tokens take the first ids, so `bos_token_id`/`eos_token_id` are the same for every vocabulary
//! size.

use super::families::{self, Extra};
use serde_json::{Value, json};

/// A named shape (the `--shape` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Llama, hidden 64, 2 layers, 4 heads / 2 KV heads, vocabulary 512, untied LM head.
    #[value(name = "tiny")]
    Tiny,
    /// SmolLM2-135M: hidden 576, 30 layers, 9/3 heads, MLP 1536, vocabulary 49152, tied.
    #[value(name = "smollm2-135m")]
    Smollm2_135m,
    /// Llama-3.2-1B: hidden 2048, 16 layers, 32/8 heads, MLP 8192, vocabulary 128256, tied, llama3 RoPE.
    #[value(name = "llama-3.2-1b")]
    Llama32_1b,
    /// Tiny Llama 3: llama3 RoPE scaling, tied embeddings, Llama 3 chat format.
    #[value(name = "tiny-llama3")]
    TinyLlama3,
    /// Tiny Mistral: multi-query attention (1 KV head), a sliding window equal to the context.
    #[value(name = "tiny-mistral")]
    TinyMistral,
    /// Tiny Qwen2: q/k/v biases, tied embeddings, ChatML.
    #[value(name = "tiny-qwen2")]
    TinyQwen2,
    /// Tiny Llama whose widths are multiples of 256 (the K-quant blocks): hidden 256, MLP 512, 2 layers.
    #[value(name = "tiny-256")]
    Tiny256,
    /// Tiny Qwen3: per-head q/k RMS norms, head_dim 128 ≠ hidden/heads, tied, ChatML.
    #[value(name = "tiny-qwen3")]
    TinyQwen3,
    /// Tiny Gemma 3 (text): sandwich norms, q/k norms, GELU-tanh, 6 layers with a 16-token sliding
    /// window on 5 of every 6 (local RoPE base 10000, global 1e6), tied.
    #[value(name = "tiny-gemma3")]
    TinyGemma3,
    /// Tiny Qwen3-MoE: 8 experts, top-2 with renormalised weights, q/k norms, untied.
    #[value(name = "tiny-qwen3moe")]
    TinyQwen3Moe,
    /// A Qwen3-MoE to benchmark decode with (bench/families.sh): hidden 1024, 8 layers, 16/4 heads of 64,
    /// 8 experts of 1024, top-2 (201 M expert parameters, 50 M of them active per token), the tiny
    /// vocabulary.
    #[value(name = "qwen3moe-bench")]
    Qwen3MoeBench,
    /// Tiny Phi-3 (Phi-4-mini style): fused qkv and gate_up, partial rotary 0.75, longrope.
    #[value(name = "tiny-phi3")]
    TinyPhi3,
}

/// Chat format: special tokens, BOS/EOS and template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// `<|im_start|>role\n…<|im_end|>` (SmolLM2, Qwen2).
    ChatMl,
    /// ChatML with Qwen3's thinking (`<think>`, `enable_thinking`) and tool calls (qwen3.rs).
    Qwen3,
    /// `<|start_header_id|>role<|end_header_id|>\n\n…<|eot_id|>` (Llama 3).
    Llama3,
    /// `<s>[INST] … [/INST]…</s>` (Mistral).
    Mistral,
    /// `<bos><start_of_turn>role\n…<end_of_turn>\n` (Gemma).
    Gemma,
    /// `<|role|>…<|end|>` (Phi-3 / Phi-4-mini).
    Phi3,
}

/// Everything that defines a generated model.
#[derive(Clone, Debug)]
pub(crate) struct ModelShape {
    pub architecture: &'static str,
    pub model_type: &'static str,
    pub family: Family,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub vocab: usize,
    pub max_pos: usize,
    pub rope_theta: f64,
    pub rope_scaling: Option<Value>,
    pub tied: bool,
    pub qkv_bias: bool,
    /// An explicit `head_dim` (None: hidden / heads).
    pub head_dim: Option<usize>,
    /// What a newer family adds (q/k norms, sandwich norms, experts, fused projections).
    pub extra: Extra,
}

/// The tiny Llama the other tiny shapes start from.
fn tiny() -> ModelShape {
    ModelShape {
        architecture: "LlamaForCausalLM",
        model_type: "llama",
        family: Family::ChatMl,
        hidden: 64,
        intermediate: 128,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        vocab: 512,
        max_pos: 2048,
        rope_theta: 10_000.0,
        rope_scaling: None,
        tied: false,
        qkv_bias: false,
        head_dim: None,
        extra: Extra::None,
    }
}

impl Shape {
    pub(crate) fn spec(self) -> ModelShape {
        let tiny = tiny();
        match self {
            Shape::Tiny => tiny,
            Shape::Smollm2_135m => ModelShape {
                hidden: 576,
                intermediate: 1536,
                layers: 30,
                heads: 9,
                kv_heads: 3,
                vocab: 49152,
                max_pos: 8192,
                rope_theta: 100_000.0,
                tied: true,
                ..tiny
            },
            Shape::Llama32_1b => ModelShape {
                family: Family::Llama3,
                hidden: 2048,
                intermediate: 8192,
                layers: 16,
                heads: 32,
                kv_heads: 8,
                vocab: 128_256,
                max_pos: 131_072,
                rope_theta: 500_000.0,
                rope_scaling: Some(
                    json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
                ),
                tied: true,
                ..tiny
            },
            Shape::TinyLlama3 => ModelShape {
                family: Family::Llama3,
                rope_theta: 500_000.0,
                // Small original context so the scaling changes frequencies of a 16-wide head.
                rope_scaling: Some(
                    json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 256}),
                ),
                tied: true,
                ..tiny
            },
            Shape::TinyMistral => ModelShape {
                architecture: "MistralForCausalLM",
                model_type: "mistral",
                family: Family::Mistral,
                kv_heads: 1,
                rope_theta: 1_000_000.0,
                ..tiny
            },
            Shape::Tiny256 => ModelShape {
                hidden: 256,
                intermediate: 512,
                ..tiny
            },
            Shape::TinyQwen2 => ModelShape {
                architecture: "Qwen2ForCausalLM",
                model_type: "qwen2",
                rope_theta: 1_000_000.0,
                tied: true,
                qkv_bias: true,
                ..tiny
            },
            Shape::TinyQwen3
            | Shape::TinyGemma3
            | Shape::TinyQwen3Moe
            | Shape::Qwen3MoeBench
            | Shape::TinyPhi3 => families::spec(self, tiny),
        }
    }
}

/// Special tokens and chat conventions of a family.
pub(crate) struct FamilyTokens {
    pub specials: &'static [&'static str],
    /// Plain (not special) added tokens, given the last ids of the vocabulary: they stay in decoded text.
    pub added: &'static [&'static str],
    /// The `bos_token` (and whether the tokenizer prepends it).
    pub bos: &'static str,
    pub prepend_bos: bool,
    pub eos: &'static str,
    /// Every token that ends generation.
    pub eos_all: &'static [&'static str],
    pub template: &'static str,
}

const CHATML: &str = "{%- for message in messages %}
{%- if message['role'] not in ['system', 'user', 'assistant'] %}
{{- raise_exception('Unknown role: ' ~ message['role']) }}
{%- endif %}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}";

const LLAMA3: &str = "{{- bos_token }}
{%- for message in messages %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}";

const MISTRAL: &str = "{{- bos_token }}
{%- for message in messages %}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
{%- endif %}
{%- if message['role'] == 'user' %}
{{- '[INST] ' + message['content'] | trim + ' [/INST]' }}
{%- else %}
{{- message['content'] | trim + eos_token }}
{%- endif %}
{%- endfor %}";

impl Family {
    pub(crate) fn tokens(self) -> FamilyTokens {
        match self {
            Family::ChatMl => FamilyTokens {
                specials: &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                added: &[],
                bos: "<|im_start|>",
                prepend_bos: false,
                eos: "<|im_end|>",
                eos_all: &["<|im_end|>", "<|endoftext|>"],
                template: CHATML,
            },
            Family::Llama3 => FamilyTokens {
                specials: &[
                    "<|begin_of_text|>",
                    "<|end_of_text|>",
                    "<|start_header_id|>",
                    "<|end_header_id|>",
                    "<|eot_id|>",
                ],
                added: &[],
                bos: "<|begin_of_text|>",
                prepend_bos: true,
                eos: "<|eot_id|>",
                eos_all: &["<|end_of_text|>", "<|eot_id|>"],
                template: LLAMA3,
            },
            Family::Mistral => FamilyTokens {
                specials: &["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
                added: &[],
                bos: "<s>",
                prepend_bos: true,
                eos: "</s>",
                eos_all: &["</s>"],
                template: MISTRAL,
            },
            Family::Gemma | Family::Phi3 => families::tokens(self),
            Family::Qwen3 => super::qwen3::tokens(Family::ChatMl.tokens()),
        }
    }
}

impl ModelShape {
    /// Width of one attention head.
    pub(crate) fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden / self.heads)
    }

    /// `rms_norm_eps`.
    pub(crate) fn rms_eps(&self) -> f64 {
        match self.extra {
            Extra::None | Extra::Phi3 { .. } => 1e-5,
            _ => 1e-6,
        }
    }

    /// `config.json`.
    pub(crate) fn config_json(&self, torch_dtype: &str) -> Value {
        let t = self.family.tokens();
        let id = |s: &str| t.specials.iter().position(|x| *x == s).expect("special token") as u32;
        let eos: Vec<u32> = t.eos_all.iter().map(|s| id(s)).collect();
        let mut c = json!({
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim(),
            "vocab_size": self.vocab,
            "max_position_embeddings": self.max_pos,
            "rms_norm_eps": self.rms_eps(),
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tied,
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
            "bos_token_id": id(t.bos),
            "eos_token_id": if eos.len() == 1 { json!(eos[0]) } else { json!(eos) },
            "torch_dtype": torch_dtype,
            "initializer_range": 0.02,
        });
        let o = c.as_object_mut().expect("object");
        match self.model_type {
            "mistral" => {
                o.insert("sliding_window".into(), json!(self.max_pos));
            }
            "qwen2" => {
                o.insert("sliding_window".into(), json!(self.max_pos));
                o.insert("use_sliding_window".into(), json!(false));
                o.insert("max_window_layers".into(), json!(self.layers));
                o.remove("attention_bias");
            }
            _ => families::adjust_config(self, o),
        }
        c
    }

    /// `tokenizer_config.json`.
    pub(crate) fn tokenizer_config_json(&self) -> Value {
        let t = self.family.tokens();
        json!({
            "bos_token": t.bos,
            "eos_token": t.eos,
            "add_bos_token": t.prepend_bos,
            "model_max_length": self.max_pos,
            "tokenizer_class": if self.family == Family::Phi3 { "GPT2Tokenizer" } else { "PreTrainedTokenizerFast" },
            "chat_template": t.template,
        })
    }

    /// `generation_config.json`.
    pub(crate) fn generation_config_json(&self) -> Value {
        let t = self.family.tokens();
        let id = |s: &str| t.specials.iter().position(|x| *x == s).expect("special token") as u32;
        let eos: Vec<u32> = t.eos_all.iter().map(|s| id(s)).collect();
        json!({"bos_token_id": id(t.bos), "eos_token_id": eos, "do_sample": true, "temperature": 0.7, "top_p": 0.9})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;
    use modelfleet_engine::model::{Architecture, ModelConfig};
    use std::path::Path;

    #[test]
    fn every_shape_has_a_config_the_engine_accepts() {
        // The newer families (families.rs) are tested there: this engine does not read them yet.
        for shape in Shape::value_variants()
            .iter()
            .filter(|s| s.spec().extra == Extra::None)
        {
            let spec = shape.spec();
            let text = spec.config_json("float32").to_string();
            let c = ModelConfig::from_json(Path::new("config.json"), &text).unwrap();
            assert_eq!(
                (c.vocab_size, c.num_layers, c.tie_word_embeddings),
                (spec.vocab, spec.layers, spec.tied)
            );
            let tokens = spec.family.tokens();
            assert_eq!(
                c.bos_token_id,
                tokens
                    .specials
                    .iter()
                    .position(|s| *s == tokens.bos)
                    .map(|i| i as u32)
            );
            match shape {
                Shape::TinyMistral => assert_eq!(c.architecture, Architecture::Mistral),
                Shape::TinyQwen2 => assert!(c.qkv_bias),
                Shape::Llama32_1b | Shape::TinyLlama3 => assert!(c.rope_scaling.is_some()),
                _ => {}
            }
        }
        let smol = Shape::Smollm2_135m.spec();
        assert_eq!(
            (smol.hidden, smol.intermediate, smol.heads, smol.kv_heads),
            (576, 1536, 9, 3)
        );
        let llama = Shape::Llama32_1b.spec();
        assert_eq!(
            (
                llama.hidden,
                llama.intermediate,
                llama.heads,
                llama.kv_heads,
                llama.vocab
            ),
            (2048, 8192, 32, 8, 128_256)
        );
    }
}
