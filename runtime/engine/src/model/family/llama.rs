//! Llama, Mistral and Qwen2 (and SmolLM, TinyLlama…, which are Llama): SwiGLU, pre-norm, RoPE on every
//! layer; Mistral's sliding window on every layer; Qwen2's q/k/v bias (set in `config.rs`).

use super::{ErrFn, check_activation};
use crate::error::Result;
use crate::model::config::{Architecture, ModelConfig};
use serde_json::Value;

pub(super) fn apply_hf(v: &Value, c: &mut ModelConfig, err: ErrFn<'_>) -> Result<()> {
    check_activation(v, &["silu"], err)?;
    // Qwen2 carries a window but only uses it with `use_sliding_window: true`, and then only on the
    // layers from `max_window_layers` on — not supported.
    if c.architecture == Architecture::Qwen2 {
        if v.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            return Err(err(
                "use_sliding_window",
                "true is not supported for Qwen2 (its window applies from max_window_layers on)".into(),
            ));
        }
        return Ok(());
    }
    window_on_every_layer(v, c, err)
}

/// A `sliding_window` shorter than the context makes every layer local (Mistral v0.1).
pub(super) fn window_on_every_layer(v: &Value, c: &mut ModelConfig, err: ErrFn<'_>) -> Result<()> {
    match v.get("sliding_window") {
        None | Some(Value::Null) => Ok(()),
        Some(x) => match x.as_u64() {
            Some(w) if w as usize >= c.max_position_embeddings => Ok(()),
            Some(w) if w > 0 => {
                c.sliding_window = Some(w as usize);
                c.local_layers = vec![true; c.num_layers];
                Ok(())
            }
            _ => Err(err(
                "sliding_window",
                format!("{x} is not a positive integer or null"),
            )),
        },
    }
}
