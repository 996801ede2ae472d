//! Qwen3-MoE (Qwen3-30B-A3B, -235B-A22B): Qwen3's attention, and in place of the dense FFN a router
//! (`mlp.gate`, `[num_experts, hidden]`) whose softmax over all experts picks the `top_k` largest,
//! renormalised to sum to 1 when `norm_topk_prob`; each picked expert is a SwiGLU FFN of width
//! `moe_intermediate_size` (`mlp.experts.E.{gate,up,down}_proj`). Layers listed in `mlp_only_layers`,
//! or off the `decoder_sparse_step` stride, keep a dense FFN of `intermediate_size`.
//!
//! Sources: `transformers`' `Qwen3MoeConfig`/`modeling_qwen3_moe.py` for the keys, defaults and the
//! routing; llama.cpp's `src/models/qwen3moe.cpp` (`build_moe_ffn` with softmax gating and normalised
//! weights) and `convert_hf_to_gguf.py` (experts stacked into `ffn_{gate,up,down}_exps`) for GGUF.

use super::{ErrFn, opt_usize};
use crate::error::{EngineError, Result};
use crate::model::config::{ModelConfig, Moe};
use crate::model::gguf::{GgufFile, GgufValue};
use serde_json::{Map, Value, json};

/// The most experts a layer may have (Qwen3-235B-A22B has 128; DeepSeek-V3 256).
const MAX_EXPERTS: usize = 1024;

pub(super) fn apply_hf(v: &Value, c: &mut ModelConfig, err: ErrFn<'_>) -> Result<()> {
    super::qwen3::apply_hf(v, c, err)?;
    let required = |key: &str| -> Result<usize> {
        opt_usize(v, key, err)?.ok_or_else(|| err(key, "missing (a MoE model must give it)".into()))
    };
    let num_experts = required("num_experts")?;
    if num_experts > MAX_EXPERTS {
        return Err(err(
            "num_experts",
            format!("{num_experts} is more than the {MAX_EXPERTS} supported"),
        ));
    }
    let top_k = required("num_experts_per_tok")?;
    if top_k > num_experts {
        return Err(err(
            "num_experts_per_tok",
            format!("{top_k} is more than num_experts ({num_experts})"),
        ));
    }
    let expert_ff = required("moe_intermediate_size")?;
    let step = opt_usize(v, "decoder_sparse_step", err)?.unwrap_or(1);
    let dense = mlp_only_layers(v, c.num_layers, err)?;
    let layers = (0..c.num_layers)
        .map(|l| !dense.contains(&l) && (l + 1).is_multiple_of(step))
        .collect();
    c.moe = Some(Moe {
        num_experts,
        top_k,
        expert_ff,
        // `Qwen3MoeConfig`'s default is false; the released checkpoints all set true.
        norm_topk_prob: v.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(false),
        layers,
    });
    Ok(())
}

/// `mlp_only_layers`: layer indices that keep a dense FFN.
fn mlp_only_layers(v: &Value, n: usize, err: ErrFn<'_>) -> Result<Vec<usize>> {
    let Some(list) = v.get("mlp_only_layers").filter(|x| !x.is_null()) else {
        return Ok(Vec::new());
    };
    let bad = || {
        err(
            "mlp_only_layers",
            format!("must be a list of layer indices below {n}"),
        )
    };
    list.as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|x| x.as_u64().map(|i| i as usize).filter(|&i| i < n).ok_or_else(bad))
        .collect()
}

/// The `config.json` keys of a `qwen3moe` GGUF file's metadata. llama.cpp routes every layer to
/// experts and always renormalises the top-k weights.
pub(super) fn gguf_keys(g: &GgufFile, hf: &mut Map<String, Value>) -> Result<()> {
    for (gguf, key) in [
        ("expert_count", "num_experts"),
        ("expert_used_count", "num_experts_per_tok"),
        ("expert_feed_forward_length", "moe_intermediate_size"),
    ] {
        let name = format!("qwen3moe.{gguf}");
        let n = g
            .get(&name)
            .and_then(GgufValue::as_u64)
            .ok_or_else(|| EngineError::Config {
                path: g.path.clone(),
                field: name.clone(),
                message: "missing (a MoE model must give it)".into(),
            })?;
        hf.insert(key.into(), json!(n));
    }
    hf.insert("norm_topk_prob".into(), json!(true));
    Ok(())
}

/// The Hugging Face names of the MoE tensors llama.cpp names differently: the router, and the
/// experts stacked into one `[experts, rows, cols]` tensor each (see `Weights::get_experts`).
pub(super) fn gguf_tensor(part: &str) -> Option<&'static str> {
    Some(match part {
        "ffn_gate_inp.weight" => "mlp.gate.weight",
        "ffn_gate_exps.weight" => "mlp.experts.gate_proj.weight",
        "ffn_up_exps.weight" => "mlp.experts.up_proj.weight",
        "ffn_down_exps.weight" => "mlp.experts.down_proj.weight",
        _ => return None,
    })
}
