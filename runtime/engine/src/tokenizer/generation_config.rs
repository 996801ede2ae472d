//! `generation_config.json`: the model's EOS ids (often more than `config.json` lists, e.g. Llama 3's
//! `<|eot_id|>`) and its default sampling parameters.
//!
//! Invariants: a missing file is an empty config; present fields are type-checked with errors naming
//! the file and field.

use crate::error::{EngineError, Result, parse_json, read_to_string};
use crate::model::token_ids;
use serde_json::Value;
use std::path::Path;

/// What the engine takes from `generation_config.json`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// EOS ids (`eos_token_id`, an id or a list).
    pub eos_token_ids: Vec<u32>,
    /// BOS id.
    pub bos_token_id: Option<u32>,
    /// Default temperature.
    pub temperature: Option<f32>,
    /// Default top-p.
    pub top_p: Option<f32>,
    /// Default top-k.
    pub top_k: Option<i32>,
    /// Default repetition penalty.
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// Reads `path`; a missing file is the empty config.
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Ok(Self::default());
        }
        Self::from_json(path, &read_to_string(path)?)
    }

    /// Parses a `generation_config.json` document.
    pub fn from_json(path: &Path, text: &str) -> Result<Self> {
        let v: Value = parse_json(path, text)?;
        let num = |field: &str| -> Result<Option<f64>> {
            match v.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => Ok(n.as_f64()),
                Some(_) => Err(EngineError::Config {
                    path: path.to_path_buf(),
                    field: field.into(),
                    message: "must be a number".into(),
                }),
            }
        };
        Ok(Self {
            eos_token_ids: token_ids(path, "eos_token_id", v.get("eos_token_id"))?,
            bos_token_id: token_ids(path, "bos_token_id", v.get("bos_token_id"))?
                .first()
                .copied(),
            temperature: num("temperature")?.map(|x| x as f32),
            top_p: num("top_p")?.map(|x| x as f32),
            top_k: num("top_k")?.map(|x| x as i32),
            repetition_penalty: num("repetition_penalty")?.map(|x| x as f32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_eos_lists_and_defaults() {
        let p = Path::new("generation_config.json");
        let g = GenerationConfig::from_json(
            p,
            r#"{"eos_token_id":[128001,128009],"bos_token_id":128000,"temperature":0.6,"top_p":0.9}"#,
        )
        .unwrap();
        assert_eq!(g.eos_token_ids, vec![128001, 128009]);
        assert_eq!(
            (g.bos_token_id, g.temperature, g.top_p, g.top_k),
            (Some(128000), Some(0.6), Some(0.9), None)
        );
        let e = GenerationConfig::from_json(p, r#"{"temperature":"hot"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("generation_config.json") && e.contains("`temperature`"),
            "{e}"
        );
    }
}
