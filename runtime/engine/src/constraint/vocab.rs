//! The model's vocabulary as llguidance sees it: the raw bytes of every token id in a [`TokTrie`], and
//! canonical tokenization of forced text through our own tokenizer (no second `tokenizers` copy).
//!
//! Bytes come from the tokenizer's vocabulary strings read the way its decoder reads them: byte-level
//! BPE (GPT-2's byte ↔ character table: SmolLM2, Llama 3, Qwen2, the generated models) or SentencePiece
//! (`▁` is a space, `<0xAB>` byte-fallback pieces are one byte). Special added tokens carry llguidance's
//! special-token marker (0xFF first), so no grammar can produce them as text; ids past the tokenizer's
//! vocabulary (padding rows of the embedding) have no bytes and are never allowed.
//!
//! Invariants: the trie has exactly the model's `vocab_size` entries (a mask lines up with a logits
//! row); tokenization is declared canonical only if probe strings encode to tokens whose bytes spell
//! them exactly (otherwise llguidance never forces tokens and only masks).

use crate::error::{EngineError, Result};
use crate::tokenizer::Tokenizer;
use serde_json::Value;
use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// How the decoder turns vocabulary strings into bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decoding {
    /// GPT-2's table: every character stands for one byte.
    ByteLevel,
    /// SentencePiece: `space` stands for ' '; with `byte_fallback`, `<0xAB>` is the byte 0xAB.
    Pieces { space: char, byte_fallback: bool },
}

/// Reads the decoder's kind from its serialized form (stable across `tokenizers` versions).
fn decoding(decoder: &Value) -> Result<Decoding> {
    let unsupported = || {
        EngineError::Constraint(format!(
            "structured output is not available for this model: its tokenizer's decoder ({}) is \
             neither byte-level nor SentencePiece",
            decoder.get("type").and_then(Value::as_str).unwrap_or("none")
        ))
    };
    let parts: Vec<&Value> = match decoder.get("type").and_then(Value::as_str) {
        Some("Sequence") => decoder
            .get("decoders")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        Some(_) => vec![decoder],
        None => return Err(unsupported()),
    };
    fn kind<'a>(p: &&'a Value) -> &'a str {
        p.get("type").and_then(Value::as_str).unwrap_or("")
    }
    if parts.iter().any(|p| kind(p) == "ByteLevel") {
        return Ok(Decoding::ByteLevel);
    }
    let mut space = None;
    for p in &parts {
        match kind(p) {
            "Metaspace" => {
                space = p
                    .get("replacement")
                    .and_then(Value::as_str)
                    .and_then(|s| s.chars().next())
            }
            "Replace" if p.get("content").and_then(Value::as_str) == Some(" ") => {
                space = p
                    .pointer("/pattern/String")
                    .and_then(Value::as_str)
                    .filter(|s| s.chars().count() == 1)
                    .and_then(|s| s.chars().next())
            }
            _ => {}
        }
    }
    let byte_fallback = parts.iter().any(|p| kind(p) == "ByteFallback");
    match space {
        Some(space) => Ok(Decoding::Pieces { space, byte_fallback }),
        None => Err(unsupported()),
    }
}

/// GPT-2's byte-level table, inverted: the character that stands for each byte → the byte. Printable
/// Latin-1 bytes stand for themselves; the others take the characters from U+0100 on, in byte order.
fn byte_level_table() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                b as char
            } else {
                next += 1;
                char::from_u32(next - 1).expect("U+0100..U+0143 are characters")
            };
            (c, b)
        })
        .collect()
}

/// The bytes of every token id below `vocab_size` (empty for ids the tokenizer does not have).
pub(crate) fn token_bytes(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Vec<Vec<u8>>> {
    let hf = tokenizer.hf();
    let decoder = serde_json::to_value(hf.get_decoder()).unwrap_or(Value::Null);
    let decoding = decoding(&decoder)?;
    let table = byte_level_table();
    let mut out = vec![Vec::new(); vocab_size];
    for (piece, id) in hf.get_vocab(false) {
        let Some(slot) = out.get_mut(id as usize) else {
            continue;
        };
        *slot = match decoding {
            // A character outside the table (malformed vocabulary) leaves the token without bytes.
            Decoding::ByteLevel => piece
                .chars()
                .map(|c| table.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_default(),
            Decoding::Pieces { space, byte_fallback } => {
                let hex = piece
                    .strip_prefix("<0x")
                    .and_then(|h| h.strip_suffix('>'))
                    .filter(|h| h.len() == 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) if byte_fallback => vec![b],
                    _ => piece.replace(space, " ").into_bytes(),
                }
            }
        };
    }
    for (id, added) in hf.get_added_tokens_decoder() {
        let Some(slot) = out.get_mut(id as usize) else {
            continue;
        };
        let mut bytes = added.content.into_bytes();
        if added.special {
            bytes.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
        }
        *slot = bytes;
    }
    Ok(out)
}

/// Our tokenizer behind llguidance's [`TokenizerEnv`].
pub(crate) struct Vocab {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
    canonical: bool,
}

/// Strings whose tokenization must spell them back exactly for forcing tokens to be safe.
const PROBES: &[&str] = &[
    "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}",
    "Hello, world! 12.5e-3 [true, null]",
    " leading space\n\ttabs and\r\nnewlines",
    "ünïcödé – 東京 😀",
];

impl Vocab {
    /// The trie of `tokenizer` for a model with `vocab_size` logits, ending at `eos` ids.
    pub(crate) fn new(tokenizer: &Tokenizer, vocab_size: usize, eos: &[u32]) -> Result<Self> {
        let words = token_bytes(tokenizer, vocab_size)?;
        let eos: Vec<u32> = eos
            .iter()
            .copied()
            .filter(|&e| (e as usize) < vocab_size)
            .collect();
        let Some(&first) = eos.first() else {
            return Err(EngineError::Constraint(
                "structured output is not available for this model: it has no end-of-sequence token".into(),
            ));
        };
        let info = TokRxInfo::new(vocab_size as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        let mut v = Self {
            trie,
            tokenizer: tokenizer.hf().clone(),
            canonical: false,
        };
        v.canonical = PROBES
            .iter()
            .all(|p| v.trie.decode_raw(&v.encode(p)) == p.as_bytes());
        Ok(v)
    }

    fn encode(&self, s: &str) -> Vec<TokenId> {
        self.tokenizer
            .encode_fast(s, false)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_else(|_| self.trie.greedy_tokenize(s.as_bytes()))
    }
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |s| self.encode(s))
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_tokenizer::tokenizer;

    #[test]
    fn byte_level_tokens_spell_their_text_and_specials_are_marked() {
        let t = tokenizer();
        let v = Vocab::new(&t, t.vocab_size() + 3, &[0]).unwrap();
        assert_eq!(v.trie.vocab_size(), t.vocab_size() + 3);
        for text in ["hello wörld 😀", "{\"a\": [1, 2]}\n"] {
            let ids = t.encode(text, false).unwrap();
            assert_eq!(v.trie.decode_raw(&ids), text.as_bytes(), "{text:?}");
        }
        // `<|end|>` (0) and `<|start|>` (1) are special: marked, never text.
        assert_eq!(v.trie.token(0)[0], TokTrie::SPECIAL_TOKEN_MARKER);
        assert!(v.trie.is_special_token(1));
        assert!(
            v.trie.token(t.vocab_size() as u32).is_empty(),
            "padding rows have no bytes"
        );
        assert!(v.canonical);
    }

    #[test]
    fn sentencepiece_pieces_and_byte_fallback() {
        let seq = serde_json::json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]});
        assert_eq!(
            decoding(&seq).unwrap(),
            Decoding::Pieces {
                space: '▁',
                byte_fallback: true
            }
        );
        let meta = serde_json::json!({"type": "Metaspace", "replacement": "▁"});
        assert!(matches!(
            decoding(&meta).unwrap(),
            Decoding::Pieces {
                byte_fallback: false,
                ..
            }
        ));
        let e = decoding(&serde_json::json!({"type": "WordPiece"})).unwrap_err();
        assert!(e.to_string().contains("WordPiece"), "{e}");
        assert_eq!(byte_level_table()[&'Ġ'], b' ');
        assert_eq!(byte_level_table()[&'Ċ'], b'\n');
    }
}
