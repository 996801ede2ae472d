//! Qwen3: Qwen2's layer with an RMSNorm over each query and key head before RoPE (`q_norm`, `k_norm`,
//! `[head_dim]`), no q/k/v bias unless `attention_bias`, and an explicit `head_dim` (Qwen3-4B: 128 with
//! hidden 2560 and 32 heads, not 80).

use super::{ErrFn, check_activation};
use crate::error::Result;
use crate::model::config::ModelConfig;
use serde_json::Value;

pub(super) fn apply_hf(v: &Value, c: &mut ModelConfig, err: ErrFn<'_>) -> Result<()> {
    check_activation(v, &["silu"], err)?;
    if v.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
        return Err(err(
            "use_sliding_window",
            "true is not supported for Qwen3 (its window applies from max_window_layers on)".into(),
        ));
    }
    let bias = v.get("attention_bias").and_then(Value::as_bool).unwrap_or(false);
    c.qkv_bias = bias;
    c.o_bias = bias;
    c.qk_norm = true;
    Ok(())
}
