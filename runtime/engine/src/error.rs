//! The engine's one error type. Every variant that comes from a file names the file, and the field or
//! tensor inside it, so a user can fix a malformed model without reading code; request-level variants
//! name the parameter and its limit (the server maps them to HTTP 400 with `param` set).

use std::path::PathBuf;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A JSON file is malformed or lacks a required field (serde's message names the field).
    #[error("{path}: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column.
        message: String,
    },
    /// A configuration field has a value the engine does not support.
    #[error("{path}: field `{field}`: {message}")]
    Config {
        /// The file (`config.json`, `generation_config.json`, …).
        path: PathBuf,
        /// The JSON field.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A weight is missing, has the wrong shape, or an unsupported dtype.
    #[error("{path}: tensor `{tensor}`: {message}")]
    Weights {
        /// The safetensors file (or the directory, when the tensor is missing everywhere).
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// What is wrong with it.
        message: String,
    },
    /// The tokenizer could not be loaded or failed on an input.
    #[error("{path}: {message}")]
    Tokenizer {
        /// `tokenizer.json` (or the model directory).
        path: PathBuf,
        /// The tokenizer's message.
        message: String,
    },
    /// The chat template could not be compiled or rendered (including `raise_exception`).
    #[error("chat template: {0}")]
    Template(String),
    /// A request parameter is out of range; `field` is the parameter's API name.
    #[error("`{field}` {message}")]
    InvalidParam {
        /// The parameter, as the API names it (`top_p`, `logit_bias`, …).
        field: &'static str,
        /// What is wrong, including the limit.
        message: String,
    },
    /// A structured-output constraint could not be compiled (bad schema, regex or grammar; over a limit;
    /// a tokenizer the token trie cannot describe) or failed while decoding.
    #[error("{0}")]
    Constraint(String),
    /// A forward batch is malformed (a bug in the caller, reported rather than panicking).
    #[error("invalid batch: {0}")]
    Batch(String),
    /// The KV-cache pool has too few free blocks.
    #[error("out of KV-cache blocks: {needed} needed, {free} free")]
    OutOfBlocks {
        /// Blocks the request needs.
        needed: usize,
        /// Blocks free in the pool.
        free: usize,
    },
}

impl EngineError {
    /// A stable label for logs and metrics.
    pub fn error_type(&self) -> &'static str {
        match self {
            EngineError::Io { .. } => "io",
            EngineError::Json { .. } => "json",
            EngineError::Config { .. } => "config",
            EngineError::Weights { .. } => "weights",
            EngineError::Tokenizer { .. } => "tokenizer",
            EngineError::Template(_) => "template",
            EngineError::InvalidParam { .. } => "invalid_param",
            EngineError::Constraint(_) => "constraint",
            EngineError::Batch(_) => "batch",
            EngineError::OutOfBlocks { .. } => "out_of_blocks",
        }
    }
}

/// The engine's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Reads a file, naming it in the error.
pub(crate) fn read_to_string(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses JSON, naming the file in the error.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(path: &std::path::Path, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| EngineError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}
