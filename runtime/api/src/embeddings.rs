//! `POST /v1/embeddings` in OpenAI's shape: the request (parsed strictly: unknown fields refused by
//! name) and the response, `float` or `base64` (little-endian f32, as OpenAI's client decodes it).

use crate::wire::Prompt;
use serde::{Deserialize, Serialize};

/// Most inputs in one request (OpenAI's own limit).
pub const MAX_INPUTS: usize = 2048;

/// `POST /v1/embeddings`.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    /// The served model name.
    pub model: String,
    /// A text, texts, token ids, or lists of token ids (one embedding each).
    pub input: Prompt,
    /// `float` (default) or `base64`.
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
    /// Elements per embedding, for models trained for truncation (Matryoshka); otherwise only the
    /// model's own size.
    #[serde(default)]
    pub dimensions: Option<u32>,
    /// The end user (accepted, not used: identity comes from the API key).
    #[serde(default)]
    pub user: Option<String>,
}

/// How embeddings are written in the response.
#[derive(Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    /// A JSON array of numbers.
    #[default]
    Float,
    /// Base64 of the little-endian f32 bytes.
    Base64,
}

impl EmbeddingRequest {
    /// The inputs as texts or token lists, in order; a clear error naming `input` for an empty list
    /// or more than [`MAX_INPUTS`].
    pub fn inputs(&self) -> Result<Vec<Input<'_>>, String> {
        let v: Vec<Input<'_>> = match &self.input {
            Prompt::Text(t) => vec![Input::Text(t)],
            Prompt::Texts(ts) => ts.iter().map(|t| Input::Text(t)).collect(),
            Prompt::Tokens(ids) => vec![Input::Tokens(ids)],
            Prompt::TokenLists(ls) => ls.iter().map(|l| Input::Tokens(l)).collect(),
        };
        if v.is_empty() {
            return Err("`input` must hold at least one text or token list".into());
        }
        if v.len() > MAX_INPUTS {
            return Err(format!(
                "`input` holds {} items; at most {MAX_INPUTS} per request",
                v.len()
            ));
        }
        Ok(v)
    }
}

/// One input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Input<'a> {
    /// A text, tokenized by the model's tokenizer with its special tokens.
    Text(&'a str),
    /// Token ids, used as they are.
    Tokens(&'a [u32]),
}

/// An embedding as the response carries it.
#[derive(Serialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum EmbeddingVector {
    /// `encoding_format: float`.
    Float(Vec<f32>),
    /// `encoding_format: base64`.
    Base64(String),
}

/// One embedding.
#[derive(Serialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
pub struct Embedding {
    /// Always `"embedding"`.
    pub object: &'static str,
    /// Position of its input in the request.
    pub index: usize,
    /// The vector.
    pub embedding: EmbeddingVector,
}

/// Tokens an embeddings request used.
#[derive(Serialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Default)]
pub struct EmbeddingUsage {
    /// Input tokens (special tokens included).
    pub prompt_tokens: usize,
    /// The same (nothing is generated).
    pub total_tokens: usize,
}

/// The response body.
#[derive(Serialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
pub struct EmbeddingResponse {
    /// Always `"list"`.
    pub object: &'static str,
    /// One per input, in input order.
    pub data: Vec<Embedding>,
    /// The model that answered.
    pub model: String,
    /// Token counts.
    pub usage: EmbeddingUsage,
}

/// `v` as OpenAI's base64 encoding: the little-endian bytes of each f32.
pub fn base64_f32(v: &[f32]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> Result<EmbeddingRequest, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn every_input_shape_parses_and_bad_ones_name_the_field() {
        let r = parse(serde_json::json!({"model": "m", "input": "hi"})).unwrap();
        assert_eq!(r.inputs().unwrap(), vec![Input::Text("hi")]);
        let r = parse(serde_json::json!({"model": "m", "input": [[1, 2], [3]], "encoding_format": "base64"}))
            .unwrap();
        assert_eq!(
            r.inputs().unwrap(),
            vec![Input::Tokens(&[1, 2]), Input::Tokens(&[3])]
        );
        assert_eq!(r.encoding_format, Some(EncodingFormat::Base64));
        let e = parse(serde_json::json!({"model": "m", "input": []}))
            .unwrap()
            .inputs()
            .unwrap_err();
        assert!(e.contains("`input`"), "{e}");
        let many = vec!["x"; MAX_INPUTS + 1];
        let e = parse(serde_json::json!({"model": "m", "input": many}))
            .unwrap()
            .inputs()
            .unwrap_err();
        assert!(e.contains("2048"), "{e}");
        let e = parse(serde_json::json!({"model": "m", "input": "x", "encoding_format": "hex"})).unwrap_err();
        assert!(e.contains("hex"), "{e}");
        let e = parse(serde_json::json!({"model": "m", "input": "x", "pooling": "mean"})).unwrap_err();
        assert!(e.contains("pooling"), "{e}");
    }

    #[test]
    fn base64_is_little_endian_f32() {
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
    }
}
