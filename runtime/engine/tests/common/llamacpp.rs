//! Logits llama.cpp computed (files written by `bench/llamacpp/reference.py`) and the comparison of
//! the engine's with them: the same token ids prefilled in one step, llama.cpp's top-64 at every
//! position (and full rows where stored) against ours.

use modelfleet_engine::ModelDir;
use modelfleet_engine::kernels::cpu::{Bf16Dot, CpuKernels};
use modelfleet_engine::kv::{FreeListPool, KvCacheManager};
use modelfleet_engine::model::{Decoder, LogitsRows, SeqInput};

pub struct Case {
    pub name: String,
    pub prompt_text: String,
    pub prompt: Vec<u32>,
    pub continuation: Vec<u32>,
    pub positions: usize,
    /// Per position: llama.cpp's top-k (token id, logit), best first.
    pub top: Vec<Vec<(u32, f32)>>,
    /// (position, llama.cpp's full row).
    pub full: Vec<(usize, Vec<f32>)>,
}

fn u32s(b: &[u8]) -> impl Iterator<Item = u32> + '_ {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

pub fn case(data: &[u8], name: &str) -> Case {
    let rest = data.strip_prefix(b"MFLLREF1\n").expect("reference file magic");
    let nl = rest.iter().position(|&b| b == b'\n').expect("header line");
    let header: serde_json::Value = serde_json::from_slice(&rest[..nl]).expect("header JSON");
    let body = &rest[nl + 1..];
    let k = header["top_k"].as_u64().unwrap() as usize;
    let c = header["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no case {name} in the reference file"));
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let positions = c["positions"].as_u64().unwrap() as usize;
    let vocab = c["vocab"].as_u64().unwrap() as usize;
    let off = c["topk_offset"].as_u64().unwrap() as usize;
    let top = (0..positions)
        .map(|p| {
            let at = off + p * k * 8;
            let ids: Vec<u32> = u32s(&body[at..at + 4 * k]).collect();
            let vals = u32s(&body[at + 4 * k..at + 8 * k]).map(f32::from_bits);
            ids.into_iter().zip(vals).collect()
        })
        .collect();
    let full = c["full_rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let at = r["offset"].as_u64().unwrap() as usize;
            let row = u32s(&body[at..at + 4 * vocab]).map(f32::from_bits).collect();
            (r["pos"].as_u64().unwrap() as usize, row)
        })
        .collect();
    Case {
        name: name.to_string(),
        prompt_text: c["prompt_text"].as_str().unwrap().to_string(),
        prompt: ids(&c["prompt_tokens"]),
        continuation: ids(&c["continuation"]),
        positions,
        top,
        full,
    }
}

/// The engine's logits at every position of `tokens`, prefilled in one step.
pub fn engine_logits(md: &ModelDir, tokens: &[u32]) -> Vec<Vec<f32>> {
    // The exact f32 products: the bf16 dot products' cost is measured by bench/accuracy.sh and
    // bounded in forward.rs.
    let kernels = CpuKernels::new(0).with_bf16_dot(Bf16Dot::Off);
    // The context this run serves, as llama.cpp's n_ctx (LongRoPE picks its factors by it).
    let mut config = md.config.clone();
    config.serving_context = tokens.len();
    let model = Decoder::load(&kernels, config, &md.weights).unwrap();
    let groups = model.kv_groups().clone();
    let blocks = (tokens.len().div_ceil(16) + 1) * groups.len();
    let mut kv = KvCacheManager::with_groups(FreeListPool::new(blocks), 16, &groups);
    let mut cache = model.new_kv_cache(&kernels, blocks, 16);
    let table = kv.allocate_slots(0, 0, tokens.len()).unwrap().to_vec();
    let seq = SeqInput {
        tokens,
        start_pos: 0,
        block_tables: &table,
        logits: LogitsRows::All,
        adapter: None,
    };
    let out = model.forward(&kernels, &[seq], &mut cache).unwrap();
    out.seq(0)
        .chunks(md.config.vocab_size)
        .map(<[f32]>::to_vec)
        .collect()
}

pub fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

/// How close the engine must come to llama.cpp on a case.
#[derive(Clone, Copy, Debug)]
pub struct Bar {
    /// Max |Δlogit| over llama.cpp's top-64 (and its full rows); `None` for quantized weights, where
    /// only top-1 agreement counts. Either way every disagreement must be a near tie (with ties of 0,
    /// none is allowed).
    pub tolerance: Option<f32>,
    /// Share of positions with the same top-1.
    pub min_top1: f64,
    /// A disagreement is a near tie when the two tokens are within this much in llama.cpp's logits…
    pub their_tie: f32,
    /// …and within this much in ours.
    pub our_tie: f32,
}

/// What a comparison measured.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    pub max_delta: f32,
    pub top1: f64,
}

/// Compares the engine with llama.cpp on `case`, printing and returning the figures.
pub fn check(md: &ModelDir, c: &Case, bar: Bar) -> Measured {
    let Bar {
        tolerance,
        min_top1,
        their_tie,
        our_tie,
    } = bar;
    let tokens: Vec<u32> = c.prompt.iter().chain(&c.continuation).copied().collect();
    let ours = engine_logits(md, &tokens);
    assert_eq!(ours.len(), c.positions, "{}: positions", c.name);
    let mut worst = (0.0f32, 0usize);
    let mut same = 0;
    for (pos, (row, top)) in ours.iter().zip(&c.top).enumerate() {
        let d = top
            .iter()
            .map(|&(id, v)| (row[id as usize] - v).abs())
            .fold(0.0, f32::max);
        if d > worst.0 {
            worst = (d, pos);
        }
        same += usize::from(argmax(row) == top[0].0);
        if argmax(row) != top[0].0 {
            let ours_top = argmax(row);
            let gap = row[ours_top as usize] - row[top[0].0 as usize];
            // llama.cpp's logit for our top-1 (absent from its top-64: not a near tie).
            let their_gap = top
                .iter()
                .find(|e| e.0 == ours_top)
                .map_or(f32::INFINITY, |e| top[0].1 - e.1);
            assert!(
                gap <= our_tie && their_gap <= their_tie,
                "{} position {pos}: top-1 {ours_top} vs llama.cpp's {}, {gap} apart in our logits, {their_gap} in llama.cpp's",
                c.name,
                top[0].0
            );
            eprintln!(
                "  {} position {pos}: ours {ours_top} ({:.3}) vs llama.cpp {} ({:.3}); llama.cpp's logit for ours {:?}; our logit for theirs {:.3}",
                c.name,
                row[ours_top as usize],
                top[0].0,
                top[0].1,
                top.iter().find(|e| e.0 == ours_top).map(|e| e.1),
                row[top[0].0 as usize]
            );
        }
    }
    for (pos, want) in &c.full {
        let d = ours[*pos]
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            tolerance.is_none_or(|t| d <= t),
            "{}: full row at position {pos}: max |Δlogit| {d}",
            c.name
        );
    }
    let frac = same as f64 / c.positions as f64;
    eprintln!(
        "{}: {} positions ({} prompt + {} greedy), max |Δlogit| on llama.cpp's top-64 {:.2e} (position {}), top-1 agreement {frac:.3}",
        c.name,
        c.positions,
        c.prompt.len(),
        c.continuation.len(),
        worst.0,
        worst.1
    );
    if let Some(t) = tolerance {
        assert!(
            worst.0 <= t,
            "{}: max |Δlogit| {} at position {} exceeds {t}",
            c.name,
            worst.0,
            worst.1
        );
    }
    // Where no near tie may flip: the engine's own greedy continuation (teacher-forced =
    // free-running, as every earlier top-1 agrees) is llama.cpp's.
    if tolerance.is_some() && min_top1 >= 1.0 {
        let n = c.prompt.len();
        let greedy: Vec<u32> = (0..c.continuation.len())
            .map(|i| argmax(&ours[n - 1 + i]))
            .collect();
        assert_eq!(greedy, c.continuation, "{}: 64-token greedy continuation", c.name);
    }
    assert!(
        frac >= min_top1,
        "{}: top-1 agreement {frac} below {min_top1}",
        c.name
    );
    Measured {
        max_delta: worst.0,
        top1: frac,
    }
}
