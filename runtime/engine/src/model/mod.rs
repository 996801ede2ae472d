//! The model: configuration, weights, what each family changes (`family`) and the decoder's forward
//! pass over a ragged batch.

mod batch;
mod config;
mod decoder;
mod family;
pub mod gguf;
pub(crate) mod gguf_model;
mod load;
pub mod lora;
mod moe;
mod scratch;
mod weights;

pub use batch::{Logits, LogitsRows, SeqInput};
pub(crate) use config::token_ids;
pub use config::{Activation, Architecture, LongRope, ModelConfig, Moe, RopeScaling};
pub use decoder::Decoder;
pub use scratch::workspace_bytes;
pub use weights::Weights;
