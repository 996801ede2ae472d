//! PEFT adapters: `gen-adapter` writes one that fits its base model, the engine reads it back with
//! the right factors and scale, and refuses adapters that do not fit (rank over the limit, another
//! base's shapes, a tampered config), naming the file and the field or tensor.

use modelfleet_engine::ModelDir;
use modelfleet_engine::lora::{AdapterIdentity, LoraAdapter, Target};
use modelfleet_runtime::gen_adapter::gen_adapter;
use modelfleet_runtime::gen_model::{GenDType, GenFormat, GenModelOptions, Shape, gen_model};
use std::path::Path;

fn model(dir: &Path, shape: Shape) {
    gen_model(
        dir,
        &GenModelOptions {
            shape,
            seed: 1,
            dtype: GenDType::F32,
            format: GenFormat::Safetensors,
        },
    )
    .unwrap();
}

fn id() -> AdapterIdentity {
    AdapterIdentity {
        name: "a".into(),
        digest: "sha256:test".into(),
    }
}

#[test]
fn a_generated_adapter_loads_with_every_target_and_its_scale() {
    let t = tempfile::tempdir().unwrap();
    let (base, adapter) = (t.path().join("base"), t.path().join("adapter"));
    model(&base, Shape::Tiny);
    gen_adapter(&adapter, &base, 4, 9, &[]).unwrap();
    let cfg = ModelDir::open(&base).unwrap().config;
    let a = LoraAdapter::load(&adapter, &cfg, 16, id()).unwrap();
    assert_eq!((a.rank, a.scale), (4, 1.0));
    assert_eq!(a.pairs.len(), 7 * cfg.num_layers);
    let q = &a.pairs[&(0, Target::Q)];
    assert_eq!(
        (q.in_features, q.out_features),
        (cfg.hidden_size, cfg.num_heads * cfg.head_dim)
    );
    assert_eq!((q.a.rows(), q.a.cols()), (4, q.in_features));
    assert_eq!((q.b.rows(), q.b.cols()), (q.out_features, 4));
    let nonzero =
        |w: &modelfleet_engine::kernels::HostWeight| (0..w.data().len()).any(|i| w.data().get(i) != 0.0);
    assert!(nonzero(&q.a) && nonzero(&q.b));
    // Same seed, same bytes: the factors are a pure function of the seed.
    let again = t.path().join("again");
    gen_adapter(&again, &base, 4, 9, &[]).unwrap();
    assert_eq!(
        std::fs::read(adapter.join("adapter_model.safetensors")).unwrap(),
        std::fs::read(again.join("adapter_model.safetensors")).unwrap()
    );
    // Only some targets; rsLoRA scaling from the config.
    let some = t.path().join("some");
    gen_adapter(&some, &base, 4, 9, &["q_proj".into(), "down_proj".into()]).unwrap();
    let cfg_path = some.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(
        &cfg_path,
        text.replace("\"use_rslora\": false", "\"use_rslora\": true"),
    )
    .unwrap();
    let s = LoraAdapter::load(&some, &cfg, 16, id()).unwrap();
    assert_eq!(s.pairs.len(), 2 * cfg.num_layers);
    assert_eq!(s.scale, 4.0 / 2.0, "lora_alpha / sqrt(r)");
}

#[test]
fn adapters_that_do_not_fit_are_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let (base, adapter) = (t.path().join("base"), t.path().join("adapter"));
    model(&base, Shape::Tiny);
    gen_adapter(&adapter, &base, 8, 1, &[]).unwrap();
    let cfg = ModelDir::open(&base).unwrap().config;
    let e = LoraAdapter::load(&adapter, &cfg, 4, id())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("adapter_config.json") && e.contains("`r`") && e.contains("limit of 4"),
        "{e}"
    );
    // A base whose MLP is wider: the adapter's gate/up/down factors no longer fit.
    let mut wider = cfg.clone();
    wider.intermediate_size += 8;
    let e = LoraAdapter::load(&adapter, &wider, 64, id())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("_proj.lora_") && e.contains("shape"),
        "the refusal names the tensor: {e}"
    );
    // Fewer layers than the adapter targets.
    let mut shallow = cfg.clone();
    shallow.num_layers = 1;
    let e = LoraAdapter::load(&adapter, &shallow, 64, id())
        .unwrap_err()
        .to_string();
    assert!(e.contains("base model has 1 layers"), "{e}");
    let cfg_path = adapter.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(
        &cfg_path,
        text.replace("\"use_dora\": false", "\"use_dora\": true"),
    )
    .unwrap();
    let e = LoraAdapter::load(&adapter, &cfg, 64, id())
        .unwrap_err()
        .to_string();
    assert!(e.contains("use_dora") && e.contains("DoRA"), "{e}");
}
