//! LoRA adapters in PEFT's layout (`adapter_config.json` + `adapter_model.safetensors`), read and
//! checked against the base model they are meant for. The forward pass applies them per row group
//! (`model::lora`); the server's registry decides which are resident.
//!
//! Invariants: an adapter is accepted only if every tensor it carries targets one of q/k/v/o/gate/up/
//! down of an existing layer with exactly the base model's shapes, its rank is within the configured
//! maximum, and it uses no option we do not implement (DoRA, `modules_to_save`, trained biases,
//! `fan_in_fan_out`); every refusal names the file and the field or tensor. The scale is
//! `lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora`.

mod config;

pub use config::{AdapterConfig, Target};

use crate::error::{EngineError, Result};
use crate::model::{ModelConfig, Weights};
use modelfleet_kernels::HostWeight;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One target module's low-rank factors, as f32: `delta(x) = scale · B · (A · x)`.
#[derive(Clone, Debug)]
pub struct LoraPair {
    /// `A`: `rank × in_features`, row-major.
    pub a: HostWeight,
    /// `B`: `out_features × rank`, row-major.
    pub b: HostWeight,
    /// Input features of the base projection.
    pub in_features: usize,
    /// Output features of the base projection.
    pub out_features: usize,
}

/// Who an adapter is: the name clients use and the content digest its bytes were verified against
/// (the digest keys the prefix cache, so two generations of one name never share blocks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterIdentity {
    /// The served name.
    pub name: String,
    /// `sha256:<hex>` canonical digest of the adapter directory.
    pub digest: String,
}

/// A loaded, validated adapter.
#[derive(Debug)]
pub struct LoraAdapter {
    /// Unique per load in this process (the engine keys its uploaded copies by it).
    pub id: u64,
    /// Served name and digest.
    pub identity: AdapterIdentity,
    /// The adapter directory.
    pub path: PathBuf,
    /// Its rank.
    pub rank: usize,
    /// The factor applied to `B · A`.
    pub scale: f32,
    /// Factors by (layer, target).
    pub pairs: BTreeMap<(usize, Target), LoraPair>,
}

impl LoraAdapter {
    /// Reads the adapter at `dir` for a base model with `base`, refusing ranks above `max_rank`.
    /// `identity.digest` must be the digest `dir` was verified against.
    pub fn load(dir: &Path, base: &ModelConfig, max_rank: usize, identity: AdapterIdentity) -> Result<Self> {
        let cfg_path = dir.join("adapter_config.json");
        let cfg = AdapterConfig::from_file(&cfg_path)?;
        let bad = |field: &str, message: String| EngineError::Config {
            path: cfg_path.clone(),
            field: field.into(),
            message,
        };
        if cfg.r > max_rank {
            return Err(bad(
                "r",
                format!("rank {} is over this server's limit of {max_rank}", cfg.r),
            ));
        }
        let weights = Weights::open(dir)?;
        let mut pairs = BTreeMap::new();
        for name in weights.names() {
            let (layer, target, factor) = parse_name(name).ok_or_else(|| EngineError::Weights {
                path: dir.to_path_buf(),
                tensor: name.into(),
                message: "not a LoRA factor of q/k/v/o/gate/up/down_proj (lora_A/lora_B .weight)".into(),
            })?;
            if layer >= base.num_layers {
                return Err(EngineError::Weights {
                    path: dir.to_path_buf(),
                    tensor: name.into(),
                    message: format!("layer {layer}, but the base model has {} layers", base.num_layers),
                });
            }
            if !cfg.target_modules.contains(&target) {
                return Err(EngineError::Weights {
                    path: dir.to_path_buf(),
                    tensor: name.into(),
                    message: format!("{} is not in target_modules", target.module()),
                });
            }
            if target.block() == "mlp" && base.is_moe(layer) {
                return Err(EngineError::Weights {
                    path: dir.to_path_buf(),
                    tensor: name.into(),
                    message: format!(
                        "layer {layer} of the base model is a mixture of experts: adapters on its \
                         {} are not supported (attention projections are)",
                        target.module()
                    ),
                });
            }
            if pairs.contains_key(&(layer, target)) {
                continue;
            }
            let (in_f, out_f) = target.shape(base);
            let prefix = &name[..name.len() - factor.len()];
            let a = weights.get(&format!("{prefix}lora_A.weight"), &[cfg.r, in_f])?;
            let b = weights.get(&format!("{prefix}lora_B.weight"), &[out_f, cfg.r])?;
            // Widened to f32 once: the factors are small and the delta is computed in f32.
            let to_f32 = |w: &HostWeight| {
                let d = w.data();
                let mut v = vec![0.0; d.len()];
                d.copy_to_f32(0, &mut v);
                HostWeight::from_f32(&v, w.rows(), w.cols()).map_err(|e| EngineError::Weights {
                    path: dir.to_path_buf(),
                    tensor: name.into(),
                    message: e.to_string(),
                })
            };
            pairs.insert(
                (layer, target),
                LoraPair {
                    a: to_f32(&a)?,
                    b: to_f32(&b)?,
                    in_features: in_f,
                    out_features: out_f,
                },
            );
        }
        if pairs.is_empty() {
            return Err(EngineError::Weights {
                path: dir.to_path_buf(),
                tensor: "*".into(),
                message: "the adapter has no LoRA factors".into(),
            });
        }
        let r = cfg.r as f32;
        let scale = if cfg.use_rslora {
            cfg.lora_alpha / r.sqrt()
        } else {
            cfg.lora_alpha / r
        };
        Ok(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            identity,
            path: dir.to_path_buf(),
            rank: cfg.r,
            scale,
            pairs,
        })
    }
}

impl LoraAdapter {
    /// Bytes of its factors in memory.
    pub fn bytes(&self) -> usize {
        self.pairs
            .values()
            .map(|p| 4 * (p.a.rows() * p.a.cols() + p.b.rows() * p.b.cols()))
            .sum()
    }
}

/// `base_model.model.model.layers.{i}.{self_attn|mlp}.{x}_proj.lora_{A|B}.weight` → (i, target, the
/// `lora_A.weight`/`lora_B.weight` suffix).
fn parse_name(name: &str) -> Option<(usize, Target, &'static str)> {
    let rest = name.strip_prefix("base_model.model.model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let factor = if rest.ends_with(".lora_A.weight") {
        "lora_A.weight"
    } else if rest.ends_with(".lora_B.weight") {
        "lora_B.weight"
    } else {
        return None;
    };
    let module = rest.strip_suffix(factor)?.strip_suffix('.')?;
    let target = Target::ALL
        .into_iter()
        .find(|t| module == format!("{}.{}", t.block(), t.module()))?;
    Some((layer, target, factor))
}
