//! `--speculative-config JSON` (vLLM's flag and keys): parsed and checked at start-up into the
//! engine's [`SpecConfig`] and, for a draft model, the model's path (and optional digest).
//!
//! Keys: `method` (`"ngram"` or `"draft_model"`; inferred as `"draft_model"` when `model` is given),
//! `num_speculative_tokens`, `prompt_lookup_min` / `prompt_lookup_max` (n-gram; when one is missing it
//! equals the other, when both are missing 1 and 4), `model` (the draft model: a Hugging Face directory
//! or GGUF file with the target's tokenizer), `disable_by_batch_size`; ours: `min_acceptance_rate`
//! (default 0.2; 0 keeps speculating whatever the acceptance) and `model_digest` (`sha256:…`: the
//! draft model is refused unless its canonical digest is this). Any other key is refused by name, so
//! a vLLM option we do not implement is never silently ignored.

use anyhow::{Context, bail};
use modelfleet_engine::speculative::{SpecConfig, SpecMethod, gate::DEFAULT_MIN_ACCEPTANCE};
use serde::Deserialize;
use std::path::PathBuf;

/// The JSON document, as given.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct Raw {
    method: Option<String>,
    model: Option<PathBuf>,
    model_digest: Option<String>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_min: Option<usize>,
    prompt_lookup_max: Option<usize>,
    disable_by_batch_size: Option<usize>,
    min_acceptance_rate: Option<f32>,
}

/// A checked `--speculative-config`.
#[derive(Clone, Debug, PartialEq)]
pub struct Speculative {
    /// The engine's settings.
    pub config: SpecConfig,
    /// The draft model, for `draft_model`.
    pub draft: Option<PathBuf>,
    /// Its required digest, if given.
    pub draft_digest: Option<String>,
}

/// Parses and checks the flag's JSON; errors name the key and the limit.
pub fn parse(json: &str) -> anyhow::Result<Speculative> {
    let raw: Raw = serde_json::from_str(json).context("--speculative-config is not a valid document")?;
    let k = raw
        .num_speculative_tokens
        .context("--speculative-config: num_speculative_tokens is required")?;
    let method = match (raw.method.as_deref(), &raw.model) {
        (Some("ngram"), None) => {
            let (lo, hi) = match (raw.prompt_lookup_min, raw.prompt_lookup_max) {
                (None, None) => (1, 4),
                (Some(lo), None) => (lo, lo),
                (None, Some(hi)) => (hi, hi),
                (Some(lo), Some(hi)) => (lo, hi),
            };
            SpecMethod::Ngram {
                prompt_lookup_min: lo,
                prompt_lookup_max: hi,
            }
        }
        (Some("ngram"), Some(_)) => bail!("--speculative-config: `model` does not go with method \"ngram\""),
        (Some("draft_model") | None, Some(_)) => SpecMethod::DraftModel,
        (Some("draft_model") | None, None) => {
            bail!("--speculative-config: a draft model needs `model` (its path)")
        }
        (Some(other), _) => bail!(
            "--speculative-config: method {other:?} is not supported (use \"ngram\" or \"draft_model\")"
        ),
    };
    if method == SpecMethod::DraftModel
        && (raw.prompt_lookup_min.is_some() || raw.prompt_lookup_max.is_some())
    {
        bail!("--speculative-config: prompt_lookup_min/max go with method \"ngram\" only");
    }
    let config = SpecConfig {
        num_speculative_tokens: k,
        method,
        disable_by_batch_size: raw.disable_by_batch_size,
        min_acceptance_rate: raw.min_acceptance_rate.unwrap_or(DEFAULT_MIN_ACCEPTANCE),
        rule: Default::default(),
        cost_gate: true,
    };
    if let Err(e) = config.validate() {
        bail!("--speculative-config: {e}");
    }
    if let Some(d) = &raw.model_digest
        && !(d.len() == 71 && d.starts_with("sha256:") && d[7..].bytes().all(|b| b.is_ascii_hexdigit()))
    {
        bail!("--speculative-config: model_digest must be sha256: and 64 hex digits, got {d:?}");
    }
    Ok(Speculative {
        config,
        draft: raw.model,
        draft_digest: raw.model_digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        format!("{:#}", parse(json).unwrap_err())
    }

    #[test]
    fn vllm_documents_parse() {
        let s = parse(r#"{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}"#).unwrap();
        assert_eq!(s.config.num_speculative_tokens, 5);
        assert_eq!(
            s.config.method,
            SpecMethod::Ngram {
                prompt_lookup_min: 4,
                prompt_lookup_max: 4
            }
        );
        assert_eq!(s.draft, None);
        let s = parse(r#"{"model": "/m/draft", "num_speculative_tokens": 3, "disable_by_batch_size": 8}"#)
            .unwrap();
        assert_eq!(
            (s.config.method, s.draft.unwrap(), s.config.disable_by_batch_size),
            (SpecMethod::DraftModel, PathBuf::from("/m/draft"), Some(8))
        );
        let s =
            parse(r#"{"method": "ngram", "num_speculative_tokens": 2, "min_acceptance_rate": 0}"#).unwrap();
        assert_eq!(s.config.min_acceptance_rate, 0.0);
    }

    #[test]
    fn bad_documents_name_the_key() {
        for (json, want) in [
            ("{", "not a valid document"),
            (r#"{"method": "ngram"}"#, "num_speculative_tokens is required"),
            (
                r#"{"method": "eagle", "num_speculative_tokens": 2}"#,
                "\"eagle\" is not supported",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
                "num_speculative_tokens must be in [1, 16]",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 17}"#,
                "[1, 16], got 17",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}"#,
                "min <= max",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "model": "x"}"#,
                "`model` does not go",
            ),
            (
                r#"{"method": "draft_model", "num_speculative_tokens": 2}"#,
                "needs `model`",
            ),
            (
                r#"{"num_speculative_tokens": 2, "disable_logprobs": true}"#,
                "unknown field `disable_logprobs`",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}"#,
                "disable_by_batch_size must be >= 1",
            ),
            (
                r#"{"model": "x", "num_speculative_tokens": 2, "model_digest": "md5:1"}"#,
                "model_digest must be",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "min_acceptance_rate": 2}"#,
                "min_acceptance_rate must be in [0, 1]",
            ),
        ] {
            let e = err(json);
            assert!(e.contains(want), "{json}: {e:?} lacks {want:?}");
        }
    }
}
