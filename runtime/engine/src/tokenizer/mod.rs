//! Text ↔ tokens: the `tokenizers` crate over `tokenizer.json`, the chat template and special tokens of
//! `tokenizer_config.json`, the EOS ids and defaults of `generation_config.json`, and incremental
//! detokenization.
//!
//! Invariants: encoding never panics (tokenizer errors are [`EngineError::Tokenizer`] naming the file);
//! chat-template output is encoded with `add_special_tokens = false` because the template already
//! writes `bos_token` where the model expects it (Hugging Face's `apply_chat_template(tokenize=True)`).

mod chat;
mod detok;
mod generation_config;
pub(crate) mod gguf;

pub use chat::{ChatMessage, ChatTemplate, ToolCallMessage};
pub use detok::IncrementalDetokenizer;
pub use generation_config::GenerationConfig;

use crate::error::{EngineError, Result, parse_json, read_to_string};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A loaded `tokenizer.json`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// The longest token string in UTF-8 bytes (see [`Tokenizer::min_tokens_for`]).
    max_token_bytes: usize,
}

impl Tokenizer {
    /// Loads `path` (a `tokenizer.json`).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = read_to_string(path)?;
        Self::from_json(path, &text)
    }

    /// Parses a `tokenizer.json` document; `path` names it in errors.
    pub fn from_json(path: &Path, text: &str) -> Result<Self> {
        let inner: tokenizers::Tokenizer = text.parse().map_err(|e| EngineError::Tokenizer {
            path: path.to_path_buf(),
            message: format!("invalid tokenizer: {e}"),
        })?;
        Ok(Self::new(inner, path.to_path_buf()))
    }

    /// Wraps a built tokenizer; `path` names it in errors.
    pub(crate) fn new(mut inner: tokenizers::Tokenizer, path: PathBuf) -> Self {
        // A `tokenizer.json` may carry the padding and truncation it was last used with (BERT
        // checkpoints often pad and cut to 128): the engine pads nothing, and an input too long is
        // refused by whoever knows the limit, never cut silently.
        inner.with_padding(None);
        let _ = inner.with_truncation(None);
        let max_token_bytes = inner
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .max(1);
        Self {
            inner,
            path,
            max_token_bytes,
        }
    }

    /// A lower bound on the number of tokens `text` encodes to, computed without tokenizing: no token
    /// stands for more bytes than its own string holds (byte-level BPE writes each byte as a 1–2 byte
    /// character, SentencePiece writes a space as the 3-byte `▁`, byte fallback as `<0xAB>`), and
    /// normalization can shrink text at most 4× (a 4-byte character folded to one byte). Lets a server
    /// refuse a prompt that cannot fit the context before spending time tokenizing it.
    pub fn min_tokens_for(&self, text: &str) -> usize {
        text.len() / (4 * self.max_token_bytes)
    }

    fn err(&self, e: impl std::fmt::Display) -> EngineError {
        EngineError::Tokenizer {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (e.g. BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| self.err(e))?
            .get_ids()
            .to_vec())
    }

    /// Text of `ids`; special tokens are dropped when `skip_special_tokens`. Ids the tokenizer does not
    /// know (embedding rows past its vocabulary) decode to nothing.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| self.err(e))
    }

    /// The id of a token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The `tokenizers` tokenizer underneath (the constraint module reads its vocabulary and decoder).
    pub(crate) fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The first difference between this vocabulary and `other`'s — a token with another id, or a
    /// token special in one and not the other — or `None` when they are the same (a draft model must
    /// share its target's, id for id).
    pub fn vocabulary_difference(&self, other: &Tokenizer) -> Option<String> {
        let (a, b) = (self.inner.get_vocab(true), other.inner.get_vocab(true));
        if a.len() != b.len() {
            return Some(format!("{} tokens vs {}", a.len(), b.len()));
        }
        let mut tokens: Vec<(&String, &u32)> = a.iter().collect();
        tokens.sort_by_key(|(_, id)| **id);
        if let Some((t, id)) = tokens.iter().find(|(t, id)| b.get(*t) != Some(id)) {
            return Some(format!(
                "token {t:?} is id {id} in one and {:?} in the other",
                b.get(*t)
            ));
        }
        let special = |t: &Tokenizer| {
            let mut ids: Vec<u32> = t
                .inner
                .get_added_tokens_decoder()
                .iter()
                .filter(|(_, tok)| tok.special)
                .map(|(id, _)| *id)
                .collect();
            ids.sort_unstable();
            ids
        };
        let (sa, sb) = (special(self), special(other));
        (sa != sb).then(|| format!("special token ids {sa:?} vs {sb:?}"))
    }
}

/// The parts of `tokenizer_config.json` the engine uses.
#[derive(Clone, Debug, Default)]
pub struct TokenizerConfig {
    /// The Jinja chat template (the `default` one when the file has several).
    pub chat_template: Option<String>,
    /// `bos_token` as text.
    pub bos_token: Option<String>,
    /// `eos_token` as text.
    pub eos_token: Option<String>,
}

impl TokenizerConfig {
    /// Reads `path`; a missing file is an empty config.
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Ok(Self::default());
        }
        Self::from_json(path, &read_to_string(path)?)
    }

    /// Parses a `tokenizer_config.json` document.
    pub fn from_json(path: &Path, text: &str) -> Result<Self> {
        let v: Value = parse_json(path, text)?;
        let err = |field: &str, message: &str| EngineError::Config {
            path: path.to_path_buf(),
            field: field.into(),
            message: message.into(),
        };
        let token = |field: &str| -> Result<Option<String>> {
            match v.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    _ => Err(err(field, "an added-token object needs a string `content`")),
                },
                Some(_) => Err(err(field, "must be a string or an added-token object")),
            }
        };
        let chat_template =
            match v.get("chat_template") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Array(list)) => {
                    let named = |n: &str| {
                        list.iter()
                            .find(|t| t.get("name").and_then(Value::as_str) == Some(n))
                            .and_then(|t| t.get("template"))
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    };
                    Some(named("default").ok_or_else(|| {
                        err("chat_template", "a list of templates needs one named \"default\"")
                    })?)
                }
                Some(_) => {
                    return Err(err(
                        "chat_template",
                        "must be a string or a list of {name, template}",
                    ));
                }
            };
        Ok(Self {
            chat_template,
            bos_token: token("bos_token")?,
            eos_token: token("eos_token")?,
        })
    }
}

#[cfg(test)]
pub(crate) mod test_tokenizer {
    //! A byte-level BPE `tokenizer.json` for unit tests: the 256 byte symbols plus a few merges and
    //! special tokens, built with the `tokenizers` crate.

    use super::Tokenizer;
    use std::path::Path;
    use tokenizers::AddedToken;
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;

    /// Ids: `<|end|>` = 0, `<|start|>` = 1, bytes from 2, then merges.
    pub(crate) fn tokenizer() -> Tokenizer {
        let mut vocab = tokenizers::models::bpe::Vocab::default();
        vocab.insert("<|end|>".into(), 0);
        vocab.insert("<|start|>".into(), 1);
        let mut chars: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        chars.sort();
        for c in chars {
            let n = vocab.len() as u32;
            vocab.insert(c.to_string(), n);
        }
        let merges: Vec<(String, String)> = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        for (a, b) in &merges {
            let n = vocab.len() as u32;
            vocab.insert(format!("{a}{b}"), n);
        }
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().unwrap();
        let mut t = tokenizers::Tokenizer::new(bpe);
        t.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
        t.with_decoder(Some(ByteLevel::default()));
        t.add_special_tokens([
            AddedToken::from("<|end|>", true),
            AddedToken::from("<|start|>", true),
        ])
        .unwrap();
        Tokenizer::from_json(Path::new("tokenizer.json"), &t.to_string(false).unwrap()).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_decodes_utf8_and_specials() {
        let t = test_tokenizer::tokenizer();
        let ids = t.encode("<|start|>hello wörld", false).unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(t.decode(&ids, true).unwrap(), "hello wörld");
        assert_eq!(t.decode(&ids, false).unwrap(), "<|start|>hello wörld");
        assert_eq!(t.token_to_id("<|end|>"), Some(0));
    }

    #[test]
    fn bad_tokenizer_names_the_file() {
        let e = Tokenizer::from_json(Path::new("x/tokenizer.json"), "{}")
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with("x/tokenizer.json: invalid tokenizer"), "{e}");
    }

    #[test]
    fn tokenizer_config_reads_templates_and_added_token_objects() {
        let p = Path::new("tokenizer_config.json");
        let c = TokenizerConfig::from_json(
            p,
            r#"{"bos_token":{"content":"<s>","lstrip":false},"eos_token":"</s>",
               "chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"D"}]}"#,
        )
        .unwrap();
        assert_eq!(
            (
                c.bos_token.as_deref(),
                c.eos_token.as_deref(),
                c.chat_template.as_deref()
            ),
            (Some("<s>"), Some("</s>"), Some("D"))
        );
        let e = TokenizerConfig::from_json(p, r#"{"chat_template": 3}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`chat_template`"), "{e}");
    }
}
