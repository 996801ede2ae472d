//! The tokenizer and chat template stored in a GGUF file's metadata (`tokenizer.ggml.*`,
//! `tokenizer.chat_template`), rebuilt with the `tokenizers` crate so GGUF and Hugging Face models
//! share one tokenizer type.
//!
//! Two vocabularies, as in llama.cpp's `llama-vocab.cpp`:
//! - `gpt2` (byte-level BPE: SmolLM, Llama 3, Qwen2): the file's merges; the pre-tokenizer follows
//!   `tokenizer.ggml.pre` (GPT-2's regex by default; Llama 3's and Qwen2's split patterns; SmolLM's
//!   single-digit split).
//! - `llama` (SentencePiece BPE: Llama 2, Mistral, TinyLlama): merges derived from the piece scores the
//!   way `transformers`' `SentencePieceExtractor` does, with `▁` for spaces, an optional leading `▁`
//!   (`add_space_prefix`) and byte fallback (`<0xAB>` pieces) — `LlamaConverter`'s tokenizer.
//!
//! Invariants: control tokens (type 3) become special added tokens and user-defined tokens (type 4)
//! plain added tokens; a BOS is prepended when `tokenizer.ggml.add_bos_token` is true (SentencePiece
//! default: true); any other vocabulary type is refused naming the key.

use super::{Tokenizer, TokenizerConfig};
use crate::error::{EngineError, Result};
use crate::model::gguf::{GgufFile, GgufValue};
use std::collections::HashMap;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Reads the tokenizer keys of one file, with errors naming it.
struct Keys<'a> {
    g: &'a GgufFile,
}

impl Keys<'_> {
    fn err(&self, message: String) -> EngineError {
        EngineError::Tokenizer {
            path: self.g.path.clone(),
            message,
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>> {
        let a = self
            .g
            .get(key)
            .and_then(GgufValue::as_array)
            .ok_or_else(|| self.err(format!("`{key}` missing")))?;
        a.iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.err(format!("`{key}` holds a non-string")))
            })
            .collect()
    }

    fn id(&self, key: &str) -> Option<u32> {
        self.g.get(key).and_then(GgufValue::as_u64).map(|v| v as u32)
    }

    fn flag(&self, key: &str) -> Option<bool> {
        match self.g.get(key) {
            Some(GgufValue::Bool(b)) => Some(*b),
            _ => None,
        }
    }
}

/// The tokenizer, its config (template, BOS/EOS strings) and the EOS ids of a GGUF file.
pub(crate) fn from_gguf(g: &GgufFile) -> Result<(Tokenizer, TokenizerConfig, Vec<u32>)> {
    let k = Keys { g };
    let model = g
        .get("tokenizer.ggml.model")
        .and_then(GgufValue::as_str)
        .unwrap_or("");
    let tokens = k.strings("tokenizer.ggml.tokens")?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type").and_then(GgufValue::as_array) {
        Some(a) => a
            .iter()
            .map(|v| {
                if let GgufValue::I64(x) = v {
                    *x
                } else {
                    v.as_u64().unwrap_or(1) as i64
                }
            })
            .collect(),
        None => vec![1; tokens.len()],
    };
    let (mut t, add_bos_default) = match model {
        "gpt2" => (byte_level_bpe(&k, &tokens)?, false),
        "llama" => (sentencepiece_bpe(&k, &tokens)?, true),
        other => {
            return Err(k.err(format!(
                "`tokenizer.ggml.model` {other:?} is not supported (\"gpt2\" byte-level BPE, \"llama\" SentencePiece)"
            )));
        }
    };
    let name = |id: u32| tokens.get(id as usize).cloned();
    let bos = k.id("tokenizer.ggml.bos_token_id");
    if let (true, Some(b)) = (
        k.flag("tokenizer.ggml.add_bos_token").unwrap_or(add_bos_default),
        bos.and_then(name),
    ) {
        let post = TemplateProcessing::builder()
            .try_single(format!("{b}:0 $A:0"))
            .and_then(|p| p.try_pair(format!("{b}:0 $A:0 {b}:1 $B:1")))
            .map_err(|e| k.err(format!("post-processor: {e}")))?
            .special_tokens(vec![(b.clone(), bos.unwrap_or(0))])
            .build()
            .map_err(|e| k.err(format!("post-processor: {e}")))?;
        t.with_post_processor(Some(post));
    }
    let of_type = |want: i64| -> Vec<AddedToken> {
        let special = want == 3;
        tokens
            .iter()
            .zip(&types)
            .filter(|(_, ty)| **ty == want)
            .map(|(tok, _)| AddedToken::from(tok.clone(), special))
            .collect()
    };
    t.add_special_tokens(of_type(3))
        .map_err(|e| k.err(format!("control tokens: {e}")))?;
    t.add_tokens(of_type(4))
        .map_err(|e| k.err(format!("user-defined tokens: {e}")))?;
    let mut eos_ids = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(i) = k.id(key)
            && !eos_ids.contains(&i)
        {
            eos_ids.push(i);
        }
    }
    let config = TokenizerConfig {
        chat_template: g
            .get("tokenizer.chat_template")
            .and_then(GgufValue::as_str)
            .map(str::to_string),
        bos_token: bos.and_then(name),
        eos_token: k.id("tokenizer.ggml.eos_token_id").and_then(name),
    };
    Ok((Tokenizer::new(t, g.path.clone()), config, eos_ids))
}

fn vocab(tokens: &[String]) -> Vocab {
    let mut v = Vocab::default();
    for (i, t) in tokens.iter().enumerate() {
        v.entry(t.clone()).or_insert(i as u32);
    }
    v
}

/// `gpt2`: byte-level BPE with the file's merges.
fn byte_level_bpe(k: &Keys<'_>, tokens: &[String]) -> Result<tokenizers::Tokenizer> {
    let merges: Vec<(String, String)> = k
        .strings("tokenizer.ggml.merges")?
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| k.err(format!("merge {m:?} has no space")))
        })
        .collect::<Result<_>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab(tokens), merges)
        .build()
        .map_err(|e| k.err(format!("BPE: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
        let s = Split::new(
            SplitPattern::Regex(pattern.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| k.err(format!("pre-tokenizer: {e}")))?;
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            s.into(),
            ByteLevel::default()
                .add_prefix_space(false)
                .use_regex(false)
                .into(),
        ])))
    };
    let byte_level = ByteLevel::default().add_prefix_space(false);
    let pre =
        k.g.get("tokenizer.ggml.pre")
            .and_then(GgufValue::as_str)
            .unwrap_or("default");
    let pre_tokenizer = match pre {
        "llama-bpe" | "llama3" | "smaug-bpe" => split(LLAMA3_PATTERN)?,
        "qwen2" => split(QWEN2_PATTERN)?,
        "smollm" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![Digits::new(true).into(), byte_level.into()]))
        }
        _ => byte_level.into(),
    };
    t.with_pre_tokenizer(Some(pre_tokenizer));
    t.with_decoder(Some(ByteLevel::default()));
    Ok(t)
}

/// Merges implied by SentencePiece scores (`transformers`' `SentencePieceExtractor.extract`): every
/// split of every piece into two pieces, ranked by the whole piece's score (highest first), ties in
/// vocabulary order.
fn merges_from_scores(tokens: &[String], scores: &[f64]) -> Vec<(String, String)> {
    let ids: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let mut merges: Vec<(usize, usize, f64)> = Vec::new();
    for (piece, score) in tokens.iter().zip(scores) {
        let mut local: Vec<(usize, usize, f64)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(i, _)| Some((*ids.get(&piece[..i])?, *ids.get(&piece[i..])?, *score)))
            .collect();
        local.sort_by_key(|&(l, r, _)| (l, r));
        merges.extend(local);
    }
    // Stable, like Python's `sorted`.
    merges.sort_by(|a, b| b.2.total_cmp(&a.2));
    merges
        .into_iter()
        .map(|(l, r, _)| (tokens[l].clone(), tokens[r].clone()))
        .collect()
}

/// `llama`: SentencePiece BPE as `transformers`' `LlamaConverter` builds it.
fn sentencepiece_bpe(k: &Keys<'_>, tokens: &[String]) -> Result<tokenizers::Tokenizer> {
    let scores: Vec<f64> = match k.g.get("tokenizer.ggml.scores").and_then(GgufValue::as_array) {
        Some(a) => a.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect(),
        None => (0..tokens.len()).map(|i| -(i as f64)).collect(),
    };
    if scores.len() != tokens.len() {
        return Err(k.err(format!(
            "`tokenizer.ggml.scores` has {} entries for {} tokens",
            scores.len(),
            tokens.len()
        )));
    }
    let unk = k
        .id("tokenizer.ggml.unknown_token_id")
        .and_then(|i| tokens.get(i as usize))
        .cloned();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab(tokens), merges_from_scores(tokens, &scores))
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = unk {
        builder = builder.unk_token(u);
    }
    let bpe = builder.build().map_err(|e| k.err(format!("BPE: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let space = Replace::new(" ", "▁").map_err(|e| k.err(format!("normalizer: {e}")))?;
    let normalizer = if k.flag("tokenizer.ggml.add_space_prefix").unwrap_or(true) {
        NormalizerSequence::new(vec![Prepend::new("▁".into()).into(), space.into()])
    } else {
        NormalizerSequence::new(vec![space.into()])
    };
    t.with_normalizer(Some(normalizer))
        .map_err(|e| k.err(format!("normalizer: {e}")))?;
    let to_space = Replace::new("▁", " ").map_err(|e| k.err(format!("decoder: {e}")))?;
    t.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(vec![
        DecoderWrapper::Replace(to_space),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
        DecoderWrapper::Strip(Strip::new(' ', 1, 0)),
    ]))));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_piece_scores() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -1.0, -0.5, -2.0];
        let m = merges_from_scores(&tokens, &scores);
        let pairs: Vec<(&str, &str)> = m.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        // "bc" scores highest, then "ab", then "abc" via (a, bc) before (ab, c) (vocabulary order).
        assert_eq!(pairs, [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]);
    }

    /// A SentencePiece vocabulary written to a GGUF file with no tensors.
    fn spm_file(dir: &std::path::Path) -> GgufFile {
        use crate::model::gguf::writer::write;
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        for p in [
            "▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁he", "llo", "▁hello", "▁w", "or", "▁wor",
            "ld", "▁world",
        ] {
            tokens.push(p.to_string());
            types.push(1);
        }
        let scores: Vec<GgufValue> = (0..tokens.len()).map(|i| GgufValue::F64(-(i as f64))).collect();
        let meta = vec![
            ("tokenizer.ggml.model".to_string(), GgufValue::Str("llama".into())),
            (
                "tokenizer.ggml.tokens".to_string(),
                GgufValue::Array(tokens.into_iter().map(GgufValue::Str).collect()),
            ),
            ("tokenizer.ggml.scores".to_string(), GgufValue::Array(scores)),
            (
                "tokenizer.ggml.token_type".to_string(),
                GgufValue::Array(types.into_iter().map(GgufValue::I64).collect()),
            ),
            ("tokenizer.ggml.bos_token_id".to_string(), GgufValue::U64(1)),
            ("tokenizer.ggml.eos_token_id".to_string(), GgufValue::U64(2)),
            ("tokenizer.ggml.unknown_token_id".to_string(), GgufValue::U64(0)),
        ];
        let path = dir.join("spm.gguf");
        let mut out = Vec::new();
        write(&mut out, &meta, &[], |_| Vec::new()).unwrap();
        std::fs::write(&path, out).unwrap();
        GgufFile::open(&path).unwrap()
    }

    #[test]
    fn sentencepiece_vocabularies_encode_with_bos_spaces_and_byte_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let (t, config, eos) = from_gguf(&spm_file(dir.path())).unwrap();
        assert_eq!(
            (config.bos_token.as_deref(), config.eos_token.as_deref(), eos),
            (Some("<s>"), Some("</s>"), vec![2])
        );
        let ids = t.encode("hello world", true).unwrap();
        let pieces: Vec<String> = ids.iter().map(|&i| t.inner.id_to_token(i).unwrap()).collect();
        assert_eq!(pieces, ["<s>", "▁hello", "▁world"]);
        assert_eq!(t.decode(&ids, true).unwrap(), "hello world");
        let accent = t.encode("hé", false).unwrap();
        let pieces: Vec<String> = accent.iter().map(|&i| t.inner.id_to_token(i).unwrap()).collect();
        assert_eq!(
            pieces,
            ["▁h", "<0xC3>", "<0xA9>"],
            "unknown characters fall back to bytes"
        );
        assert_eq!(t.decode(&accent, true).unwrap(), "hé");
    }
}
