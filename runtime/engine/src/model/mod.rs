//! The model: configuration, weights and the Llama-family forward pass over a ragged batch.

mod batch;
mod config;
pub mod gguf;
pub(crate) mod gguf_model;
mod llama;
pub mod lora;
mod scratch;
mod weights;

pub use batch::{Logits, LogitsRows, SeqInput};
pub(crate) use config::token_ids;
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use llama::LlamaModel;
pub use scratch::workspace_bytes;
pub use weights::Weights;
