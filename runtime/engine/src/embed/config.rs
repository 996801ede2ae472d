//! What an embedding model's files say: the encoder's shape (`config.json` of a BERT-family model) and
//! how token states become one vector — sentence-transformers' `modules.json`, its Pooling module's
//! `config.json` (`1_Pooling/` for most) and a `Normalize` module, `sentence_bert_config.json`'s
//! `max_seq_length` — with vLLM's defaults for a bare `BertModel` (CLS pooling, normalised).
//!
//! Invariants: every field is checked here, so a model the encoder cannot run fails at start-up with
//! the file and field named; the pooling is exactly one mode (sentence-transformers concatenates
//! several, which no client expects from `/v1/embeddings`).

use crate::error::{EngineError, Result, parse_json, read_to_string};
use serde::Deserialize;
use std::path::Path;

/// The encoder's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    /// Token embedding rows.
    pub vocab_size: usize,
    /// Width of every token state.
    pub hidden_size: usize,
    /// Transformer layers.
    pub num_layers: usize,
    /// Attention heads (`hidden_size / num_heads` each).
    pub num_heads: usize,
    /// FFN width.
    pub intermediate_size: usize,
    /// Position embedding rows: the longest input.
    pub max_position_embeddings: usize,
    /// Token-type embedding rows (every input is type 0).
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f32,
    /// Dimensions a client may truncate to (`dimensions`), when the model was trained for it.
    pub matryoshka_dimensions: Option<Vec<usize>>,
}

/// How a sequence's token states become its embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's state (`[CLS]`).
    Cls,
    /// The mean over every token.
    Mean,
    /// The element-wise maximum over every token.
    Max,
    /// The sum over every token divided by the square root of their count.
    MeanSqrtLen,
    /// The last token's state (decoder embedding models).
    LastToken,
}

impl Pooling {
    /// The name the API and the logs use.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Mean => "mean",
            Pooling::Max => "max",
            Pooling::MeanSqrtLen => "mean_sqrt_len",
            Pooling::LastToken => "last",
        }
    }
}

/// Everything besides the weights and the tokenizer.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedConfig {
    /// The encoder.
    pub encoder: EncoderConfig,
    /// Pooling.
    pub pooling: Pooling,
    /// Embeddings are scaled to unit length.
    pub normalize: bool,
    /// The longest input in tokens (special tokens included).
    pub max_input_tokens: usize,
}

/// The architectures of `config.json` this module loads.
pub const ENCODER_ARCHITECTURES: &[&str] = &["BertModel", "BertForMaskedLM", "BertForPreTraining"];

/// True when the model directory `dir` holds an encoder this module loads (`config.json` names a BERT
/// architecture or `model_type: bert`).
pub fn is_encoder(dir: &Path) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(default)]
        architectures: Vec<String>,
        #[serde(default)]
        model_type: Option<String>,
    }
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else {
        return false;
    };
    serde_json::from_str::<Probe>(&text).is_ok_and(|p| {
        p.architectures
            .iter()
            .any(|a| ENCODER_ARCHITECTURES.contains(&a.as_str()))
            || p.model_type.as_deref() == Some("bert")
    })
}

#[derive(Deserialize)]
struct RawConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    type_vocab_size: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f32,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default)]
    position_embedding_type: Option<String>,
    #[serde(default)]
    matryoshka_dimensions: Option<Vec<usize>>,
}

fn default_positions() -> usize {
    512
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f32 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}

impl EmbedConfig {
    /// Reads and checks the configuration files of the model directory `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let raw: RawConfig = parse_json(&path, &read_to_string(&path)?)?;
        let encoder = encoder(&path, raw)?;
        let (pooling, normalize) = sentence_transformers(dir, encoder.hidden_size)?;
        let max_input_tokens = max_seq_length(dir)?
            .unwrap_or(encoder.max_position_embeddings)
            .min(encoder.max_position_embeddings);
        Ok(Self {
            encoder,
            pooling,
            normalize,
            max_input_tokens,
        })
    }
}

fn config_err(path: &Path, field: &str, message: impl Into<String>) -> EngineError {
    EngineError::Config {
        path: path.to_path_buf(),
        field: field.into(),
        message: message.into(),
    }
}

fn encoder(path: &Path, raw: RawConfig) -> Result<EncoderConfig> {
    if raw.hidden_act != "gelu" {
        return Err(config_err(
            path,
            "hidden_act",
            format!(
                "{:?} is not supported (only \"gelu\", the exact GELU)",
                raw.hidden_act
            ),
        ));
    }
    if let Some(p) = raw
        .position_embedding_type
        .as_deref()
        .filter(|p| *p != "absolute")
    {
        return Err(config_err(
            path,
            "position_embedding_type",
            format!("{p:?} is not supported (only \"absolute\")"),
        ));
    }
    let positive = [
        ("vocab_size", raw.vocab_size),
        ("hidden_size", raw.hidden_size),
        ("num_hidden_layers", raw.num_hidden_layers),
        ("num_attention_heads", raw.num_attention_heads),
        ("intermediate_size", raw.intermediate_size),
        ("max_position_embeddings", raw.max_position_embeddings),
        ("type_vocab_size", raw.type_vocab_size),
    ];
    if let Some((f, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(config_err(path, f, "must be at least 1"));
    }
    if !raw.hidden_size.is_multiple_of(raw.num_attention_heads) {
        return Err(config_err(
            path,
            "num_attention_heads",
            format!(
                "{} does not divide hidden_size {}",
                raw.num_attention_heads, raw.hidden_size
            ),
        ));
    }
    if !(raw.layer_norm_eps > 0.0 && raw.layer_norm_eps < 1.0) {
        return Err(config_err(path, "layer_norm_eps", "must be in (0, 1)"));
    }
    if let Some(dims) = &raw.matryoshka_dimensions
        && let Some(bad) = dims.iter().find(|&&d| d == 0 || d > raw.hidden_size)
    {
        return Err(config_err(
            path,
            "matryoshka_dimensions",
            format!("{bad} is not in 1..={}", raw.hidden_size),
        ));
    }
    Ok(EncoderConfig {
        vocab_size: raw.vocab_size,
        hidden_size: raw.hidden_size,
        num_layers: raw.num_hidden_layers,
        num_heads: raw.num_attention_heads,
        intermediate_size: raw.intermediate_size,
        max_position_embeddings: raw.max_position_embeddings,
        type_vocab_size: raw.type_vocab_size,
        layer_norm_eps: raw.layer_norm_eps,
        matryoshka_dimensions: raw.matryoshka_dimensions,
    })
}

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// Pooling and normalisation from `modules.json`, or vLLM's BERT default (CLS, normalised).
fn sentence_transformers(dir: &Path, hidden: usize) -> Result<(Pooling, bool)> {
    let path = dir.join("modules.json");
    if !path.exists() {
        return Ok((Pooling::Cls, true));
    }
    let modules: Vec<Module> = parse_json(&path, &read_to_string(&path)?)?;
    let normalize = modules.iter().any(|m| m.kind.ends_with(".Normalize"));
    let pooling_dir = modules
        .iter()
        .find(|m| m.kind.ends_with(".Pooling"))
        .map(|m| m.path.clone());
    if let Some(other) = modules.iter().find(|m| {
        !(m.kind.ends_with(".Transformer") || m.kind.ends_with(".Pooling") || m.kind.ends_with(".Normalize"))
    }) {
        return Err(config_err(
            &path,
            "type",
            format!(
                "module {:?} is not supported (Transformer, Pooling and Normalize are)",
                other.kind
            ),
        ));
    }
    let Some(pdir) = pooling_dir else {
        return Ok((Pooling::Cls, normalize));
    };
    if pdir.contains("..") || Path::new(&pdir).is_absolute() {
        return Err(config_err(
            &path,
            "path",
            format!("{pdir:?} is not inside the model directory"),
        ));
    }
    Ok((
        pooling_mode(&dir.join(pdir).join("config.json"), hidden)?,
        normalize,
    ))
}

/// The one pooling mode a Pooling module's `config.json` turns on.
fn pooling_mode(path: &Path, hidden: usize) -> Result<Pooling> {
    let v: serde_json::Value = parse_json(path, &read_to_string(path)?)?;
    if let Some(d) = v.get("word_embedding_dimension").and_then(|d| d.as_u64())
        && d as usize != hidden
    {
        return Err(config_err(
            path,
            "word_embedding_dimension",
            format!("{d} differs from the encoder's hidden_size {hidden}"),
        ));
    }
    let modes = [
        ("pooling_mode_cls_token", Pooling::Cls),
        ("pooling_mode_mean_tokens", Pooling::Mean),
        ("pooling_mode_max_tokens", Pooling::Max),
        ("pooling_mode_mean_sqrt_len_tokens", Pooling::MeanSqrtLen),
        ("pooling_mode_lasttoken", Pooling::LastToken),
    ];
    let on: Vec<_> = modes
        .iter()
        .filter(|(f, _)| v.get(*f).and_then(|b| b.as_bool()) == Some(true))
        .collect();
    if let Some(w) = v
        .get("pooling_mode_weightedmean_tokens")
        .and_then(|b| b.as_bool())
        && w
    {
        return Err(config_err(
            path,
            "pooling_mode_weightedmean_tokens",
            "is not supported",
        ));
    }
    match on.as_slice() {
        [(_, p)] => Ok(*p),
        [] => Err(config_err(path, "pooling_mode_*", "no pooling mode is on")),
        many => Err(config_err(
            path,
            many[1].0,
            format!("only one pooling mode may be on (also {})", many[0].0),
        )),
    }
}

/// `sentence_bert_config.json`'s `max_seq_length`, if the file exists.
fn max_seq_length(dir: &Path) -> Result<Option<usize>> {
    let path = dir.join("sentence_bert_config.json");
    if !path.exists() {
        return Ok(None);
    }
    let v: serde_json::Value = parse_json(&path, &read_to_string(&path)?)?;
    match v.get("max_seq_length") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(n) => match n.as_u64() {
            Some(n) if n >= 2 => Ok(Some(n as usize)),
            _ => Err(config_err(
                &path,
                "max_seq_length",
                format!("{n} is not an integer ≥ 2"),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let p = d.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    const BERT: &str = r#"{"architectures":["BertModel"],"model_type":"bert","vocab_size":100,
        "hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":64,
        "max_position_embeddings":64}"#;
    const MODULES: &str = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#;

    #[test]
    fn sentence_transformers_files_decide_pooling_normalisation_and_length() {
        let d = dir(&[
            ("config.json", BERT),
            ("modules.json", MODULES),
            (
                "1_Pooling/config.json",
                r#"{"word_embedding_dimension":32,"pooling_mode_mean_tokens":true}"#,
            ),
            ("sentence_bert_config.json", r#"{"max_seq_length":48}"#),
        ]);
        assert!(is_encoder(d.path()));
        let c = EmbedConfig::open(d.path()).unwrap();
        assert_eq!(
            (c.pooling, c.normalize, c.max_input_tokens),
            (Pooling::Mean, true, 48)
        );
        assert_eq!(c.encoder.num_heads, 4);
        // A bare BertModel: CLS, normalised, as long as its positions.
        let d = dir(&[("config.json", BERT)]);
        let c = EmbedConfig::open(d.path()).unwrap();
        assert_eq!(
            (c.pooling, c.normalize, c.max_input_tokens),
            (Pooling::Cls, true, 64)
        );
    }

    #[test]
    fn what_the_encoder_cannot_run_is_refused_naming_the_field() {
        let cases = [
            (BERT.replace("}", ",\"hidden_act\":\"relu\"}"), "hidden_act"),
            (
                BERT.replace("\"num_attention_heads\":4", "\"num_attention_heads\":5"),
                "num_attention_heads",
            ),
            (
                BERT.replace("}", ",\"position_embedding_type\":\"relative_key\"}"),
                "position_embedding_type",
            ),
            (
                BERT.replace("}", ",\"matryoshka_dimensions\":[16,64]}"),
                "matryoshka_dimensions",
            ),
        ];
        for (config, field) in cases {
            let d = dir(&[("config.json", &config)]);
            let e = EmbedConfig::open(d.path()).unwrap_err().to_string();
            assert!(e.contains(&format!("`{field}`")), "{field}: {e}");
        }
        let two = r#"{"pooling_mode_mean_tokens":true,"pooling_mode_cls_token":true}"#;
        let d = dir(&[
            ("config.json", BERT),
            ("modules.json", MODULES),
            ("1_Pooling/config.json", two),
        ]);
        let e = EmbedConfig::open(d.path()).unwrap_err().to_string();
        assert!(e.contains("only one pooling mode"), "{e}");
        let d = dir(&[("config.json", r#"{"architectures":["LlamaForCausalLM"]}"#)]);
        assert!(!is_encoder(d.path()));
    }
}
