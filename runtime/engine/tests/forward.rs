//! Forward-pass properties on the testkit's tiny Qwen2 (random weights): batch invariance
//! (bit-identical logits alone or in any batch), chunked prefill and decode agreeing bit for bit with one
//! full prefill, weights in f16/bf16 and an f16 KV cache close to f32, and malformed batches reported as
//! errors.

use modelfleet_engine::EngineError;
use modelfleet_engine::kv::{FreeListPool, KvCacheManager};
use modelfleet_engine::model::{Decoder, LogitsRows, ModelConfig, SeqInput, Weights};
use modelfleet_kernels::cpu::{Bf16Dot, CpuKernels, Isa};
use modelfleet_kernels::{Kernels, KvDType};
use modelfleet_testkit::gen_model::{GenDType, GenFormat, Shape};
use safetensors::tensor::Dtype;

mod common;

/// The tiny shapes' vocabulary and context (`Shape::TinyQwen2`; the fixture checks them).
const VOCAB: usize = 512;
const MAX_POS: usize = 2048;

/// Deterministic values in [-scale, scale) (the test prompts' token ids).
fn lcg(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

struct Fixture {
    kernels: CpuKernels,
    model: Decoder<CpuKernels>,
    _dir: tempfile::TempDir,
}

/// The testkit's tiny Qwen2 (2 layers, GQA 4/2 heads, q/k/v bias; random weights, seed 3) with its
/// weights stored as `dtype` (the same values, rounded), on `threads` threads.
fn fixture(dtype: Dtype, threads: usize) -> Fixture {
    fixture_with(dtype, CpuKernels::new(threads).with_bf16_dot(Bf16Dot::Off))
}

/// [`fixture`] on `kernels`.
fn fixture_with(dtype: Dtype, kernels: CpuKernels) -> Fixture {
    fixture_of(Shape::TinyQwen2, dtype, kernels)
}

/// [`fixture_with`] of another tiny shape (of the same vocabulary and context).
fn fixture_of(shape: Shape, dtype: Dtype, kernels: CpuKernels) -> Fixture {
    let gen_dtype = match dtype {
        Dtype::F16 => GenDType::F16,
        Dtype::BF16 => GenDType::Bf16,
        _ => GenDType::F32,
    };
    let dir = common::generated(shape, 3, gen_dtype, GenFormat::Safetensors);
    let config = ModelConfig::from_file(&dir.path().join("config.json")).unwrap();
    assert_eq!(
        (config.vocab_size, config.max_position_embeddings),
        (VOCAB, MAX_POS)
    );
    let weights = Weights::open(dir.path()).unwrap();
    let model = Decoder::load(&kernels, config, &weights).unwrap();
    Fixture {
        kernels,
        model,
        _dir: dir,
    }
}

fn prompt(seed: u64, n: usize) -> Vec<u32> {
    lcg(seed, n, 1.0)
        .iter()
        .map(|v| ((v + 1.0) * 0.5 * (VOCAB - 1) as f32) as u32)
        .collect()
}

/// Runs each sequence's full prompt in one prefill with all logits.
fn alone(f: &Fixture, tokens: &[u32]) -> Vec<f32> {
    alone_as(f, tokens, KvDType::F32)
}

/// [`alone`] with a KV cache of `dtype`.
fn alone_as(f: &Fixture, tokens: &[u32], dtype: KvDType) -> Vec<f32> {
    let mut kv = KvCacheManager::new(FreeListPool::new(64), 4);
    let mut cache = f.model.new_kv_cache_as(&f.kernels, 64, 4, dtype);
    let table = kv.allocate_slots(1, 0, tokens.len()).unwrap().to_vec();
    let seq = SeqInput {
        tokens,
        start_pos: 0,
        block_tables: &table,
        logits: LogitsRows::All,
        adapter: None,
    };
    f.model
        .forward(&f.kernels, &[seq], &mut cache)
        .unwrap()
        .seq(0)
        .to_vec()
}

/// The largest |a − b| over two logit vectors.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn logits_are_bit_identical_alone_or_in_a_mixed_batch() {
    for dtype in [KvDType::F32, KvDType::F16, KvDType::Q8_0] {
        mixed_batch_matches_alone(&fixture(Dtype::F32, 2), dtype);
    }
}

/// A mixture of experts too: which rows share an expert in a step changes with the batch, and must
/// not change any row's logits.
#[test]
fn moe_logits_are_bit_identical_alone_or_in_a_mixed_batch() {
    let kernels = CpuKernels::new(2).with_bf16_dot(Bf16Dot::Off);
    let f = fixture_of(Shape::TinyQwen3Moe, Dtype::F32, kernels);
    assert!(f.model.config().is_moe(0));
    mixed_batch_matches_alone(&f, KvDType::F32);
}

fn mixed_batch_matches_alone(f: &Fixture, dtype: KvDType) {
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(i, 3 + 7 * i as usize)).collect();
    let want: Vec<Vec<f32>> = prompts.iter().map(|p| alone_as(f, p, dtype)).collect();
    // The same sequences in one cache, advanced in steps of different sizes so that every step mixes
    // prefill chunks and single decode tokens of different sequences.
    let mut kv = KvCacheManager::new(FreeListPool::new(64), 4);
    let mut cache = f.model.new_kv_cache_as(&f.kernels, 64, 4, dtype);
    let mut done = vec![0usize; prompts.len()];
    let mut got: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
    let mut step = 0;
    while done.iter().zip(&prompts).any(|(d, p)| d < &p.len()) {
        let mut chunks = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            if done[i] == p.len() {
                continue;
            }
            let n = (1 + (i + step) % 5).min(p.len() - done[i]);
            kv.allocate_slots(i as u64, done[i], n).unwrap();
            chunks.push((i, done[i], n));
        }
        let tables: Vec<Vec<Vec<u32>>> = chunks
            .iter()
            .map(|&(i, _, _)| kv.block_tables(i as u64).to_vec())
            .collect();
        let batch: Vec<SeqInput<'_>> = chunks
            .iter()
            .zip(&tables)
            .map(|(&(i, start, n), t)| SeqInput {
                tokens: &prompts[i][start..start + n],
                start_pos: start,
                block_tables: t,
                logits: LogitsRows::All,
                adapter: None,
            })
            .collect();
        let logits = f.model.forward(&f.kernels, &batch, &mut cache).unwrap();
        for (j, &(i, _, n)) in chunks.iter().enumerate() {
            got[i].extend_from_slice(logits.seq(j));
            done[i] += n;
        }
        step += 1;
    }
    for i in 0..prompts.len() {
        assert_eq!(bits(&got[i]), bits(&want[i]), "{dtype:?} cache, sequence {i}");
    }
}

#[test]
fn an_f16_and_an_8_bit_kv_cache_track_f32() {
    let f = fixture(Dtype::F32, 2);
    // f16 rounds each element to 11 significant bits, q8_0 to 1/254 of its vector's largest: the
    // logits move by a bounded amount and keep the top token.
    for (dtype, bound) in [(KvDType::F16, 0.01), (KvDType::Q8_0, 0.03)] {
        for seed in 0..4 {
            let p = prompt(20 + seed, 30);
            let (a, b) = (alone(&f, &p), alone_as(&f, &p, dtype));
            let max = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
            let spread = a.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(
                max < bound * spread.max(1.0),
                "{dtype:?}: max |Δ| {max} (logits up to {spread})"
            );
            assert!(max > 0.0, "the cache really is {dtype:?}");
            for (r, (x, y)) in a.chunks(VOCAB).zip(b.chunks(VOCAB)).enumerate() {
                let top = |v: &[f32]| (0..VOCAB).fold(0, |m, i| if v[i] > v[m] { i } else { m });
                let (tx, ty) = (top(x), top(y));
                // The same top token, unless the f32 logits are a near tie.
                assert!(
                    tx == ty || (x[tx] - x[ty]).abs() < 2.0 * max,
                    "{dtype:?} row {r}: {tx} vs {ty}"
                );
            }
        }
    }
}

#[test]
fn thread_count_does_not_change_logits() {
    let p = prompt(9, 21);
    let one = alone(&fixture(Dtype::BF16, 1), &p);
    let three = alone(&fixture(Dtype::BF16, 3), &p);
    assert_eq!(bits(&one), bits(&three));
}

#[test]
fn last_row_logits_equal_the_last_of_all_rows() {
    let f = fixture(Dtype::F32, 2);
    let p = prompt(3, 10);
    let all = alone(&f, &p);
    let mut cache = f.model.new_kv_cache(&f.kernels, 8, 4);
    let table = [vec![5u32, 2, 7]];
    let seq = SeqInput {
        tokens: &p,
        start_pos: 0,
        block_tables: &table,
        logits: LogitsRows::Last,
        adapter: None,
    };
    let none = SeqInput {
        tokens: &p[..2],
        start_pos: 0,
        block_tables: &[vec![0]],
        logits: LogitsRows::None,
        adapter: None,
    };
    let out = f.model.forward(&f.kernels, &[none, seq], &mut cache).unwrap();
    assert!(out.last(0).is_none());
    assert_eq!(bits(out.last(1).unwrap()), bits(&all[9 * VOCAB..]));
}

#[test]
fn half_precision_weights_track_f32() {
    let p = prompt(4, 12);
    let f32_logits = alone(&fixture(Dtype::F32, 2), &p);
    for dt in [Dtype::F16, Dtype::BF16] {
        let f = fixture(dt, 2);
        let l = alone(&f, &p);
        let max = max_abs_diff(&l, &f32_logits);
        let tol = if dt == Dtype::F16 { 0.02 } else { 0.15 };
        assert!(max < tol, "{dt:?}: max |Δ| {max}");
        assert!(l.iter().all(|v| v.is_finite()));
    }
}

/// f16 and bf16 weights on bf16 dot products (kernels/src/cpu/bfpanels.rs): f16 rounded to bf16 costs
/// about twice the exact path's error against f32, and a sequence's logits are the same bits on 1 and
/// 3 threads and alone or beside another sequence.
#[test]
fn bf16_dot_products_track_f32_and_keep_batch_invariance() {
    if Isa::detect() != Isa::Avx512 || !modelfleet_kernels::cpu::bf16_dot_supported() {
        eprintln!("skipped: no AVX-512 BF16 here");
        return;
    }
    let p = prompt(4, 12);
    let f32_logits = alone(&fixture(Dtype::F32, 2), &p);
    for (dt, tol) in [(Dtype::F16, 0.06), (Dtype::BF16, 0.15)] {
        let with = |threads| fixture_with(dt, CpuKernels::new(threads).with_bf16_dot(Bf16Dot::All));
        let (one, three) = (with(1), with(3));
        assert!(one.kernels.describe().contains("bf16-dot"));
        let l = alone(&one, &p);
        let max = max_abs_diff(&l, &f32_logits);
        assert!(max < tol, "{dt:?}: max |Δ| {max}");
        let exact = alone(&fixture(dt, 2), &p);
        assert_ne!(bits(&l), bits(&exact), "{dt:?}: the bf16 panels were not used");
        assert_eq!(bits(&l), bits(&alone(&three, &p)), "{dt:?}: 1 vs 3 threads");
        // Beside another sequence in the same step: the same last row.
        let other = prompt(8, 7);
        let mut cache = one.model.new_kv_cache(&one.kernels, 16, 4);
        let (t0, t1) = ([vec![0u32, 1]], [vec![2u32, 3, 4, 5]]);
        let seqs = [
            SeqInput {
                tokens: &other,
                start_pos: 0,
                block_tables: &t0,
                logits: LogitsRows::Last,
                adapter: None,
            },
            SeqInput {
                tokens: &p,
                start_pos: 0,
                block_tables: &t1,
                logits: LogitsRows::Last,
                adapter: None,
            },
        ];
        let out = one.model.forward(&one.kernels, &seqs, &mut cache).unwrap();
        assert_eq!(
            bits(out.last(1).unwrap()),
            bits(&l[11 * VOCAB..]),
            "{dt:?}: in a batch"
        );
    }
}

#[test]
fn malformed_batches_are_errors() {
    let f = fixture(Dtype::F32, 1);
    let mut cache = f.model.new_kv_cache(&f.kernels, 4, 4);
    let (zero, nine, long) = ([vec![0]], [vec![9]], [vec![0; MAX_POS / 4 + 1]]);
    let cases: Vec<(SeqInput<'_>, &str)> = vec![
        (
            SeqInput {
                tokens: &[VOCAB as u32],
                start_pos: 0,
                block_tables: &zero,
                logits: LogitsRows::Last,
                adapter: None,
            },
            "outside the vocabulary",
        ),
        (
            SeqInput {
                tokens: &[1; 5],
                start_pos: 0,
                block_tables: &zero,
                logits: LogitsRows::Last,
                adapter: None,
            },
            "covers fewer than 5",
        ),
        (
            SeqInput {
                tokens: &[1],
                start_pos: 0,
                block_tables: &nine,
                logits: LogitsRows::Last,
                adapter: None,
            },
            "outside the KV cache",
        ),
        (
            SeqInput {
                tokens: &[],
                start_pos: 0,
                block_tables: &zero,
                logits: LogitsRows::Last,
                adapter: None,
            },
            "no new tokens",
        ),
        (
            SeqInput {
                tokens: &[1],
                start_pos: MAX_POS,
                block_tables: &long,
                logits: LogitsRows::Last,
                adapter: None,
            },
            "max_position_embeddings",
        ),
    ];
    for (seq, want) in cases {
        match f.model.forward(&f.kernels, &[seq], &mut cache) {
            Err(EngineError::Batch(m)) => assert!(m.contains(want), "{m} lacks {want}"),
            other => panic!(
                "expected a batch error containing {want:?}, got {:?}",
                other.map(|_| ())
            ),
        }
    }
}
