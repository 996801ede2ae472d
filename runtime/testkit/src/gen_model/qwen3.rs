//! The Qwen3 chat format of the generated Qwen3 shapes: ChatML's special tokens, plus `<tool_call>`,
//! `</tool_call>`, `<think>` and `</think>` as plain added tokens (as in Qwen3's tokenizer: not special,
//! so they stay in decoded text), and a template in the spirit of Qwen3's (qwen3_chat_template.jinja):
//! tools described in the system turn, calls and tool results in the history, reasoning of earlier
//! turns dropped, and `enable_thinking=false` (a `chat_template_kwargs` variable) answered with an empty
//! `<think>\n\n</think>\n\n` in the generation prompt.
//!
//! Invariant: the added tokens take the vocabulary's last ids, so every other id, and every tensor, is
//! what it was before they existed (the llama.cpp reference data of `tiny-qwen3` still applies).

use super::shapes::FamilyTokens;

/// The template (a Jinja text, rendered by the engine's minijinja).
pub(crate) const TEMPLATE: &str = include_str!("qwen3_chat_template.jinja");

/// Qwen3's tokens, from ChatML's.
pub(crate) fn tokens(chatml: FamilyTokens) -> FamilyTokens {
    FamilyTokens {
        added: &["<tool_call>", "</tool_call>", "<think>", "</think>"],
        template: TEMPLATE,
        ..chatml
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen_model::{GenDType, GenFormat, GenModelOptions, Shape, gen_model};
    use modelfleet_engine::ModelDir;
    use modelfleet_engine::tokenizer::{ChatMessage, ChatTemplate, ToolCallMessage};
    use serde_json::json;

    fn template() -> ChatTemplate {
        ChatTemplate::new(TEMPLATE, Some("<|im_start|>"), Some("<|im_end|>")).unwrap()
    }

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
    }

    #[test]
    fn thinking_is_on_unless_turned_off() {
        let t = template();
        let m = msgs(&[("system", "Be brief."), ("user", "2+2?")]);
        let base = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(t.render(&m, true).unwrap(), base);
        let off = json!({"enable_thinking": false});
        assert_eq!(
            t.render_with(&m, None, true, off.as_object()).unwrap(),
            format!("{base}<think>\n\n</think>\n\n")
        );
        let on = json!({"enable_thinking": true});
        assert_eq!(t.render_with(&m, None, true, on.as_object()).unwrap(), base);
    }

    #[test]
    fn reasoning_is_kept_only_after_the_last_question() {
        let t = template();
        let m = msgs(&[
            ("user", "a?"),
            ("assistant", "<think>\nold\n</think>\n\nA"),
            ("user", "b?"),
            ("assistant", "<think>\nnew\n</think>\n\nB"),
        ]);
        let out = t.render(&m, false).unwrap();
        assert!(out.contains("<|im_start|>assistant\nA<|im_end|>"), "{out}");
        assert!(
            out.ends_with("<|im_start|>assistant\n<think>\nnew\n</think>\n\nB<|im_end|>\n"),
            "{out}"
        );
    }

    #[test]
    fn tools_calls_and_results_render() {
        let t = template();
        assert!(t.renders_tools());
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = vec![ToolCallMessage {
            id: "c1".into(),
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}),
        }];
        let mut result = ChatMessage::new("tool", "18C");
        result.tool_call_id = Some("c1".into());
        let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let m = vec![ChatMessage::new("user", "Weather?"), call, result];
        let out = t.render_with_tools(&m, Some(&tools), true).unwrap();
        assert!(out.starts_with("<|im_start|>system\n# Tools"), "{out}");
        assert!(out.contains("\"get_weather\""), "{out}");
        assert!(
            out.contains("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call><|im_end|>"),
            "{out}"
        );
        assert!(
            out.ends_with(
                "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            ),
            "{out}"
        );
    }

    #[test]
    fn generated_qwen3_models_have_the_tags_as_tokens_in_both_formats() {
        for format in [GenFormat::Safetensors, GenFormat::Gguf] {
            let dir = tempfile::tempdir().unwrap();
            let opts = GenModelOptions {
                shape: Shape::TinyQwen3,
                seed: 7,
                dtype: GenDType::F16,
                format,
            };
            gen_model(dir.path(), &opts).unwrap();
            let md = ModelDir::open(dir.path()).unwrap();
            for (i, tag) in ["<tool_call>", "</tool_call>", "<think>", "</think>"]
                .iter()
                .enumerate()
            {
                assert_eq!(
                    md.tokenizer.token_to_id(tag),
                    Some(508 + i as u32),
                    "{format:?} {tag}"
                );
            }
            let ids = md.tokenizer.encode("<think>x</think>y", false).unwrap();
            assert_eq!((ids[0], ids.len()), (510, 4), "{format:?}");
            assert_eq!(md.tokenizer.decode(&ids, true).unwrap(), "<think>x</think>y");
            assert!(md.chat_template.unwrap().source().contains("<think>"));
        }
    }
}
