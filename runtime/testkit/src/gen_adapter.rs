//! [`gen_adapter`]: a random PEFT LoRA adapter for a base model (`adapter_config.json` +
//! `adapter_model.safetensors`, f32), for tests and benchmarks; `modelfleet-runtime gen-adapter DIR
//! --base MODEL --rank R --seed N` is its command line.
//!
//! Invariants: shapes come from the base model's config, so the adapter always fits its base; values
//! depend only on the seed: `A ~ N(0, 1/in_features)`, `B ~ N(0, 1/(4·rank))` (PEFT initialises B to
//! zero, which would make a test adapter a no-op), `lora_alpha = rank`, so the delta's RMS is about half
//! the RMS of its input.

use modelfleet_engine::ModelDir;
use modelfleet_engine::lora::Target;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;

fn normal(rng: &mut ChaCha8Rng, std: f64) -> f32 {
    // Box–Muller.
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * std) as f32
}

/// Writes a random adapter of `rank` for `base` into `dir`.
pub fn gen_adapter(
    dir: &Path,
    base: &Path,
    rank: usize,
    seed: u64,
    targets: &[String],
) -> anyhow::Result<()> {
    anyhow::ensure!(rank >= 1, "--rank must be >= 1");
    let md = ModelDir::open(base)?;
    let cfg = &md.config;
    let targets: Vec<Target> = if targets.is_empty() {
        Target::ALL.to_vec()
    } else {
        targets
            .iter()
            .map(|n| {
                Target::ALL
                    .into_iter()
                    .find(|t| t.module() == n)
                    .ok_or_else(|| anyhow::anyhow!("--targets: unknown module {n:?}"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    std::fs::create_dir_all(dir)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for layer in 0..cfg.num_layers {
        for t in &targets {
            let (in_f, out_f) = t.shape(cfg);
            let prefix = format!(
                "base_model.model.model.layers.{layer}.{}.{}",
                t.block(),
                t.module()
            );
            let a: Vec<f32> = (0..rank * in_f)
                .map(|_| normal(&mut rng, (1.0 / in_f as f64).sqrt()))
                .collect();
            let b: Vec<f32> = (0..out_f * rank)
                .map(|_| normal(&mut rng, (1.0 / (4.0 * rank as f64)).sqrt()))
                .collect();
            tensors.push((format!("{prefix}.lora_A.weight"), vec![rank, in_f], bytes(&a)));
            tensors.push((format!("{prefix}.lora_B.weight"), vec![out_f, rank], bytes(&b)));
        }
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, d)| Ok((n.clone(), TensorView::new(Dtype::F32, s.clone(), d)?)))
        .collect::<Result<_, safetensors::SafeTensorError>>()?;
    let weights = dir.join("adapter_model.safetensors");
    safetensors::serialize_to_file(views, None, &weights)?;
    // `serialize_to_file` creates the file owner-only; adapters are read by the runtime's own user
    // (a pod reading a node directory runs as another user than the one that wrote it).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&weights, std::fs::Permissions::from_mode(0o644))?;
    }
    let config = serde_json::json!({
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": targets.iter().map(|t| t.module()).collect::<Vec<_>>(),
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base.display().to_string(),
    });
    std::fs::write(
        dir.join("adapter_config.json"),
        serde_json::to_string_pretty(&config)? + "\n",
    )?;
    Ok(())
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
