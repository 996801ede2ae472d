//! LoRA in the forward pass, checked against an independent formulation: the base model with the
//! adapter merged into its weights (W + scale·B·A, written as a new safetensors model) must give the
//! same logits (max |Δ| ≤ 2e-2 at every prompt position) and the same 64-token greedy continuation
//! as the base model with the adapter applied per row group. And through the step loop: a mixed batch
//! of base + 3 adapters gives each request the tokens it gets alone, also when `max_loras` forces
//! requests to wait for an adapter slot, and prefix-cache blocks are never shared across adapters.
//! Under speculative decoding, adapter requests verify their n-gram drafts with their adapter (their
//! tokens are the ones they get without speculation), and a draft model drafts for base requests only.

use modelfleet_engine::lora::{AdapterIdentity, LoraAdapter, Target};
use modelfleet_engine::model::{LogitsRows, SeqInput};
use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sched::{
    EngineHandle, QueueLimits, Request, RequestEvent, RequestStream, SchedulerConfig, TenantLimits,
};
use modelfleet_engine::speculative::SpecConfig;
use modelfleet_engine::{Engine, EngineConfig, ModelDir};
use modelfleet_testkit::gen_adapter::gen_adapter;
use modelfleet_testkit::gen_model::{GenDType, GenFormat, Shape};
use safetensors::tensor::{Dtype, TensorView};
mod common;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

fn base_model(dir: &Path, shape: Shape) {
    common::generate_into(dir, shape, 5, GenDType::F32, GenFormat::Safetensors);
}

fn load_adapter(dir: &Path, base: &Path, name: &str) -> Arc<LoraAdapter> {
    let cfg = ModelDir::open(base).unwrap().config;
    let identity = AdapterIdentity {
        name: name.into(),
        digest: modelfleet_engine::digest::digest_path(dir).unwrap(),
    };
    Arc::new(LoraAdapter::load(dir, &cfg, 64, identity).unwrap())
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Writes `base` with `adapter` merged into its weights (f64 accumulation) into `out`.
fn merge(base: &Path, adapter: &LoraAdapter, out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    for entry in std::fs::read_dir(base).unwrap() {
        let p = entry.unwrap().path();
        if p.file_name().unwrap() != "model.safetensors" {
            std::fs::copy(&p, out.join(p.file_name().unwrap())).unwrap();
        }
    }
    let bytes = std::fs::read(base.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        assert_eq!(view.dtype(), Dtype::F32, "the base is generated in f32");
        let mut w = f32s(view.data());
        for (&(layer, target), pair) in &adapter.pairs {
            if name
                != format!(
                    "model.layers.{layer}.{}.{}.weight",
                    target.block(),
                    target.module()
                )
            {
                continue;
            }
            let (r, inf, outf) = (adapter.rank, pair.in_features, pair.out_features);
            let a: Vec<f32> = (0..r * inf).map(|i| pair.a.data().get(i)).collect();
            let b: Vec<f32> = (0..outf * r).map(|i| pair.b.data().get(i)).collect();
            for o in 0..outf {
                for i in 0..inf {
                    let d: f64 = (0..r).map(|k| b[o * r + k] as f64 * a[k * inf + i] as f64).sum();
                    w[o * inf + i] = (w[o * inf + i] as f64 + adapter.scale as f64 * d) as f32;
                }
            }
        }
        let data: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.push((name.to_string(), view.shape().to_vec(), data));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors")).unwrap();
}

fn engine(dir: &Path) -> Engine {
    Engine::load(
        dir,
        &EngineConfig {
            threads: 1,
            num_kv_blocks: Some(16),
            max_model_len: Some(256),
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

/// Logits of every prompt position, then the greedy continuation of `n` tokens.
fn run(e: &mut Engine, prompt: &[u32], adapter: Option<&Arc<LoraAdapter>>, n: usize) -> (Vec<f32>, Vec<u32>) {
    let table: Vec<Vec<u32>> = vec![(0..16).collect()];
    let adapters: Vec<Arc<LoraAdapter>> = adapter.into_iter().cloned().collect();
    let idx = adapter.map(|_| 0);
    let first = e
        .step_lora(
            &[SeqInput {
                tokens: prompt,
                start_pos: 0,
                block_tables: &table,
                logits: LogitsRows::All,
                adapter: idx,
            }],
            &adapters,
        )
        .unwrap();
    let all = first.seq(0).to_vec();
    let argmax = |row: &[f32]| {
        row.iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0 as u32
    };
    let mut tokens = vec![argmax(first.last(0).unwrap())];
    while tokens.len() < n {
        let pos = prompt.len() + tokens.len() - 1;
        let l = e
            .step_lora(
                &[SeqInput {
                    tokens: &tokens[tokens.len() - 1..],
                    start_pos: pos,
                    block_tables: &table,
                    logits: LogitsRows::Last,
                    adapter: idx,
                }],
                &adapters,
            )
            .unwrap();
        tokens.push(argmax(l.last(0).unwrap()));
    }
    (all, tokens)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn check_against_merged(shape: Shape) {
    let t = tempfile::tempdir().unwrap();
    let (base, adir, merged) = (
        t.path().join("base"),
        t.path().join("adapter"),
        t.path().join("merged"),
    );
    base_model(&base, shape);
    gen_adapter(&adir, &base, 8, 3, &[]).unwrap();
    let adapter = load_adapter(&adir, &base, "a");
    assert_eq!(
        adapter.pairs.len(),
        7 * ModelDir::open(&base).unwrap().config.num_layers
    );
    merge(&base, &adapter, &merged);
    let md = ModelDir::open(&base).unwrap();
    let prompt = md
        .tokenizer
        .encode("The quick brown fox jumps over the lazy dog, then", false)
        .unwrap();
    let (mut with_lora, mut reference) = (engine(&base), engine(&merged));
    let (lora_logits, lora_tokens) = run(&mut with_lora, &prompt, Some(&adapter), 64);
    let (ref_logits, ref_tokens) = run(&mut reference, &prompt, None, 64);
    let (base_logits, _) = run(&mut with_lora, &prompt, None, 1);
    let d = max_abs_diff(&lora_logits, &ref_logits);
    assert!(d <= 2e-2, "{shape:?}: max |Δlogit| vs merged weights = {d}");
    assert_eq!(
        lora_tokens, ref_tokens,
        "{shape:?}: the 64-token greedy continuation"
    );
    let moved = max_abs_diff(&lora_logits, &base_logits);
    assert!(
        moved > 0.5,
        "{shape:?}: the adapter must change the logits (moved {moved})"
    );
    eprintln!("{shape:?}: max |Δ| vs merged {d:.2e}; vs base {moved:.2}");
}

#[test]
fn adapter_output_equals_the_merged_weights_llama() {
    check_against_merged(Shape::Tiny);
}

#[test]
fn adapter_output_equals_the_merged_weights_qwen2_with_biases() {
    check_against_merged(Shape::TinyQwen2);
}

#[test]
fn an_adapter_on_some_targets_leaves_the_others_alone() {
    let t = tempfile::tempdir().unwrap();
    let (base, adir, merged) = (
        t.path().join("base"),
        t.path().join("adapter"),
        t.path().join("merged"),
    );
    base_model(&base, Shape::Tiny);
    gen_adapter(&adir, &base, 4, 8, &["v_proj".into(), "down_proj".into()]).unwrap();
    let adapter = load_adapter(&adir, &base, "some");
    assert!(
        adapter
            .pairs
            .keys()
            .all(|(_, t)| matches!(t, Target::V | Target::Down))
    );
    merge(&base, &adapter, &merged);
    let prompt: Vec<u32> = (30..70).collect();
    let (l, tk) = run(&mut engine(&base), &prompt, Some(&adapter), 16);
    let (r, rt) = run(&mut engine(&merged), &prompt, None, 16);
    assert!(max_abs_diff(&l, &r) <= 2e-2);
    assert_eq!(tk, rt);
}

// --- Through the step loop ---

fn start(dir: &Path, max_loras: usize) -> EngineHandle {
    start_spec(dir, max_loras, None, false)
}

/// A step loop with `speculative` set; `draft_is_base` attaches the base model as its own draft.
fn start_spec(
    dir: &Path,
    max_loras: usize,
    speculative: Option<SpecConfig>,
    draft_is_base: bool,
) -> EngineHandle {
    let path = dir.to_path_buf();
    EngineHandle::start(
        move || {
            let mut e = Engine::load(
                &path,
                &EngineConfig {
                    threads: 1,
                    num_kv_blocks: Some(128),
                    max_model_len: Some(512),
                    max_loras,
                    ..EngineConfig::default()
                },
            )?;
            if draft_is_base {
                e.attach_draft(ModelDir::open(&path)?, 128)?;
            }
            Ok(e)
        },
        SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            enable_prefix_caching: true,
            max_loras,
            speculative,
        },
        QueueLimits {
            max_queued_requests: 100,
            max_queued_tokens: 100_000,
        },
    )
    .unwrap()
}

fn request(h: &EngineHandle, prompt: Vec<u32>, adapter: Option<Arc<LoraAdapter>>, n: usize) -> Request {
    Request {
        tenant: "t".into(),
        cache_scope: "t".into(),
        adapter,
        cache_salt: None,
        priority: 0,
        prompt,
        params: SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(n)
        }
        .validate(h.model_dir().config.vocab_size)
        .unwrap(),
        arrival: Instant::now(),
        deadline: None,
        first_token_deadline: None,
    }
}

/// The generated tokens and the cached prompt tokens.
fn collect(mut s: RequestStream) -> (Vec<u32>, usize) {
    let mut tokens = Vec::new();
    loop {
        match s.blocking_next() {
            Some(RequestEvent::Token(t)) => tokens.push(t.token),
            Some(RequestEvent::Finished(f)) => return (tokens, f.usage.cached_tokens),
            None => panic!("ended without Finished"),
        }
    }
}

fn prompt(salt: u32) -> Vec<u32> {
    (0..40u32).map(|i| 20 + (i * 13 + salt * 37) % 400).collect()
}

/// No adapter, then `n` rank-8 adapters generated in `dir` for `base` with seeds `seed`, `seed + 1`, ….
fn base_and_adapters(dir: &Path, base: &Path, n: u64, seed: u64) -> Vec<Option<Arc<LoraAdapter>>> {
    let adapters = (0..n).map(|i| {
        let d = dir.join(format!("a{i}"));
        gen_adapter(&d, base, 8, seed + i, &[]).unwrap();
        Some(load_adapter(&d, base, &format!("a{i}")))
    });
    std::iter::once(None).chain(adapters).collect()
}

#[test]
fn a_mixed_batch_of_base_and_three_adapters_matches_each_alone() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    base_model(&base, Shape::Tiny);
    let choices = base_and_adapters(t.path(), &base, 3, 10);
    // Alone, one at a time.
    let h = start(&base, 4);
    let alone: Vec<Vec<u32>> = choices
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let s = h.submit(
                request(&h, prompt(i as u32), a.clone(), 24),
                TenantLimits::default(),
            );
            collect(s.unwrap()).0
        })
        .collect();
    let distinct: std::collections::HashSet<&Vec<u32>> = alone.iter().collect();
    assert_eq!(
        distinct.len(),
        4,
        "base and each adapter generate different tokens"
    );
    drop(h);
    // Together (two requests per choice, all in flight at once), with 4 slots and then with 2 slots
    // (requests for a third adapter wait for a slot, they do not fail).
    for max_loras in [4, 2] {
        let h = start(&base, max_loras);
        let streams: Vec<(usize, RequestStream)> = (0..8)
            .map(|k| {
                let i = k % 4;
                let r = request(&h, prompt(i as u32), choices[i].clone(), 24);
                (i, h.submit(r, TenantLimits::default()).unwrap())
            })
            .collect();
        for (i, s) in streams {
            assert_eq!(
                collect(s).0,
                alone[i],
                "max_loras {max_loras}: choice {i} in a mixed batch"
            );
        }
        // Stats are published after the step that sent the last `Finished`: wait for it.
        let t0 = Instant::now();
        let idle =
            |s: &modelfleet_engine::sched::Stats| (s.running, s.waiting, s.kv_blocks_in_use) == (0, 0, 0);
        while !idle(&h.stats()) && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(idle(&h.stats()), "max_loras {max_loras}: {:?}", h.stats());
        assert!(h.stats().adapters.is_empty());
    }
}

#[test]
fn prefix_blocks_are_never_shared_across_adapters_or_generations() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    base_model(&base, Shape::Tiny);
    let d1 = t.path().join("g1");
    let d2 = t.path().join("g2");
    gen_adapter(&d1, &base, 8, 1, &[]).unwrap();
    gen_adapter(&d2, &base, 8, 2, &[]).unwrap();
    // Two generations of one served name: same name, different digests.
    let (g1, g2) = (load_adapter(&d1, &base, "same"), load_adapter(&d2, &base, "same"));
    let h = start(&base, 4);
    let run = |a: Option<&Arc<LoraAdapter>>| {
        let r = request(&h, prompt(99), a.cloned(), 4);
        collect(h.submit(r, TenantLimits::default()).unwrap())
    };
    let (base_tokens, cached) = run(None);
    assert_eq!(cached, 0);
    let (g1_tokens, cached) = run(Some(&g1));
    assert_eq!(cached, 0, "the base's blocks are not the adapter's");
    let (_, cached) = run(Some(&g2));
    assert_eq!(cached, 0, "another generation's blocks are not reused");
    let (again, cached) = run(Some(&g1));
    assert!(cached >= 32, "the same generation hits its own blocks ({cached})");
    assert_eq!(again, g1_tokens);
    assert_ne!(g1_tokens, base_tokens);
}

/// Waits for the stats published after the last request's step; returns them once idle.
fn idle_stats(h: &EngineHandle) -> modelfleet_engine::sched::Stats {
    let t0 = Instant::now();
    let idle = |s: &modelfleet_engine::sched::Stats| (s.running, s.waiting, s.kv_blocks_in_use) == (0, 0, 0);
    while !idle(&h.stats()) && t0.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let s = h.stats();
    assert!(idle(&s), "{s:?}");
    s
}

#[test]
fn adapter_requests_verify_with_their_adapter_under_speculation() {
    let t = tempfile::tempdir().unwrap();
    let base = common::smollm2_gguf();
    let tok = ModelDir::open(&base).unwrap().tokenizer;
    let choices = base_and_adapters(t.path(), &base, 2, 20);
    let run = |h: &EngineHandle, prompts: &[Vec<u32>], which: &[usize]| -> Vec<Vec<u32>> {
        let streams: Vec<RequestStream> = which
            .iter()
            .map(|&i| {
                let r = request(h, prompts[i].clone(), choices[i].clone(), 48);
                h.submit(r, TenantLimits::default()).unwrap()
            })
            .collect();
        streams.into_iter().map(|s| collect(s).0).collect()
    };
    // Text to copy, so the n-gram lookup proposes what the model goes on to write.
    let prompts: Vec<Vec<u32>> = [
        "Copy the list twice. alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa. alpha, beta, gamma,",
        "Repeat: the red fox runs, the blue bird sings, the green frog jumps. Again: the red fox runs, the",
        "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 1 2 3 4 5 6",
    ]
    .iter()
    .map(|p| tok.encode(p, false).unwrap())
    .collect();
    let plain = start(&base, 4);
    let want: Vec<Vec<u32>> = (0..3).map(|i| run(&plain, &prompts, &[i]).remove(0)).collect();
    assert_eq!(
        want.iter().collect::<std::collections::HashSet<_>>().len(),
        3,
        "base and each adapter generate different tokens"
    );
    drop(plain);
    let ngram = SpecConfig {
        min_acceptance_rate: 0.0,
        ..SpecConfig::ngram(4, 1, 3)
    };
    // N-gram drafts for adapter requests only, alone and then all together with a base request: every
    // accepted draft was verified by the adapter's own logits, or their tokens would differ.
    let h = start_spec(&base, 4, Some(ngram), false);
    for i in [1, 2] {
        assert_eq!(
            run(&h, &prompts, &[i]),
            vec![want[i].clone()],
            "adapter {i} alone"
        );
    }
    let s = idle_stats(&h);
    assert!(
        s.spec.accepted_tokens > 0,
        "adapter requests had drafts accepted: {:?}",
        s.spec
    );
    eprintln!("adapter requests alone: {:?}", s.spec);
    assert_eq!(
        run(&h, &prompts, &[1, 0, 2, 1]),
        [1, 0, 2, 1].map(|i| want[i].clone())
    );
    drop(h);
    // A draft model (here the base model itself) drafts for base requests only: adapter requests
    // decode plainly, and every request keeps its tokens.
    let draft = SpecConfig {
        min_acceptance_rate: 0.0,
        ..SpecConfig::draft_model(3)
    };
    let h = start_spec(&base, 4, Some(draft), true);
    assert_eq!(run(&h, &prompts, &[1, 2]), vec![want[1].clone(), want[2].clone()]);
    assert_eq!(
        idle_stats(&h).spec.draft_tokens,
        0,
        "no drafts for adapter requests"
    );
    assert_eq!(run(&h, &prompts, &[0, 1]), vec![want[0].clone(), want[1].clone()]);
    assert!(idle_stats(&h).spec.draft_tokens > 0, "the base request drafted");
}
