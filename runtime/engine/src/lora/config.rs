//! `adapter_config.json` (PEFT): the fields we implement, and refusals for the ones we do not.

use crate::error::{EngineError, Result, parse_json, read_to_string};
use crate::model::ModelConfig;
use serde_json::Value;
use std::path::Path;

/// A projection a LoRA adapter may target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// Attention query.
    Q,
    /// Attention key.
    K,
    /// Attention value.
    V,
    /// Attention output.
    O,
    /// MLP gate.
    Gate,
    /// MLP up.
    Up,
    /// MLP down.
    Down,
}

impl Target {
    /// Every target, in layer order.
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// PEFT's module name (`q_proj`, …).
    pub fn module(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The block holding it (`self_attn` or `mlp`).
    pub fn block(self) -> &'static str {
        match self {
            Target::Q | Target::K | Target::V | Target::O => "self_attn",
            _ => "mlp",
        }
    }

    /// (in_features, out_features) of the base projection.
    pub fn shape(self, c: &ModelConfig) -> (usize, usize) {
        let (h, q, kv, i) = (
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
            c.intermediate_size,
        );
        match self {
            Target::Q => (h, q),
            Target::K | Target::V => (h, kv),
            Target::O => (q, h),
            Target::Gate | Target::Up => (h, i),
            Target::Down => (i, h),
        }
    }
}

/// The parts of `adapter_config.json` that decide how the adapter applies.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterConfig {
    /// Rank.
    pub r: usize,
    /// Scaling numerator.
    pub lora_alpha: f32,
    /// `lora_alpha / sqrt(r)` instead of `/ r`.
    pub use_rslora: bool,
    /// The targeted projections.
    pub target_modules: Vec<Target>,
}

impl AdapterConfig {
    /// Reads and checks `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let v: Value = parse_json(path, &read_to_string(path)?)?;
        Self::from_value(path, &v)
    }

    fn from_value(path: &Path, v: &Value) -> Result<Self> {
        let bad = |field: &str, message: String| EngineError::Config {
            path: path.to_path_buf(),
            field: field.into(),
            message,
        };
        let peft = v.get("peft_type").and_then(Value::as_str).unwrap_or("LORA");
        if peft != "LORA" {
            return Err(bad(
                "peft_type",
                format!("only LORA adapters are supported, got {peft:?}"),
            ));
        }
        let r = v
            .get("r")
            .and_then(Value::as_u64)
            .filter(|r| *r >= 1)
            .ok_or_else(|| bad("r", "must be an integer >= 1".into()))? as usize;
        let lora_alpha = v
            .get("lora_alpha")
            .map_or(Some(8.0), Value::as_f64)
            .filter(|a| a.is_finite())
            .ok_or_else(|| bad("lora_alpha", "must be a number".into()))? as f32;
        let flag = |name: &str| v.get(name).and_then(Value::as_bool).unwrap_or(false);
        if flag("use_dora") {
            return Err(bad("use_dora", "DoRA adapters are not supported".into()));
        }
        if flag("fan_in_fan_out") {
            return Err(bad(
                "fan_in_fan_out",
                "transposed (Conv1D-style) weights are not supported".into(),
            ));
        }
        if v.get("modules_to_save").is_some_and(|m| !m.is_null()) {
            return Err(bad(
                "modules_to_save",
                "adapters that replace whole modules are not supported".into(),
            ));
        }
        match v.get("bias").and_then(Value::as_str).unwrap_or("none") {
            "none" => {}
            other => return Err(bad("bias", format!("only \"none\" is supported, got {other:?}"))),
        }
        let names: Vec<String> = match v.get("target_modules") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(String::from)).collect(),
            _ => {
                return Err(bad(
                    "target_modules",
                    "must be a module name or a list of them".into(),
                ));
            }
        };
        let mut target_modules = Vec::new();
        for n in &names {
            let t = Target::ALL.into_iter().find(|t| t.module() == n).ok_or_else(|| {
                bad(
                    "target_modules",
                    format!(
                        "{n:?} is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"
                    ),
                )
            })?;
            target_modules.push(t);
        }
        if target_modules.is_empty() {
            return Err(bad("target_modules", "must name at least one module".into()));
        }
        Ok(Self {
            r,
            lora_alpha,
            use_rslora: flag("use_rslora"),
            target_modules,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<AdapterConfig> {
        AdapterConfig::from_value(Path::new("adapter_config.json"), &v)
    }

    #[test]
    fn reads_peft_fields_and_refuses_what_is_not_implemented() {
        let ok = parse(
            json!({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "down_proj"],
            "bias": "none", "use_rslora": true, "modules_to_save": null}),
        )
        .unwrap();
        assert_eq!((ok.r, ok.lora_alpha, ok.use_rslora), (8, 16.0, true));
        assert_eq!(ok.target_modules, vec![Target::Q, Target::Down]);
        let cases = [
            (
                json!({"r": 8, "target_modules": ["q_proj"], "use_dora": true}),
                "use_dora",
            ),
            (
                json!({"r": 8, "target_modules": ["q_proj"], "modules_to_save": ["lm_head"]}),
                "modules_to_save",
            ),
            (
                json!({"r": 8, "target_modules": ["q_proj"], "bias": "all"}),
                "bias",
            ),
            (json!({"r": 0, "target_modules": ["q_proj"]}), "r"),
            (
                json!({"r": 8, "target_modules": ["embed_tokens"]}),
                "target_modules",
            ),
            (
                json!({"r": 8, "target_modules": ["q_proj"], "peft_type": "IA3"}),
                "peft_type",
            ),
        ];
        for (v, field) in cases {
            let e = parse(v.clone()).unwrap_err().to_string();
            assert!(e.contains(&format!("field `{field}`")), "{v}: {e}");
        }
    }
}
