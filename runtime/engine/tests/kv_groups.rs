//! KV-cache groups on a real forward pass: a tiny Gemma 3 (five local layers to one global) with a
//! window of 8 positions, decoded a token at a time through a pool so small that the local groups'
//! blocks must be given back and reused while the sequence grows, gives bit for bit the logits of
//! one prefill of the whole sequence (which holds every block) — so no step ever read a block that had
//! left its window, and the global group kept the whole context.

mod common;

use modelfleet_engine::ModelDir;
use modelfleet_engine::kernels::cpu::CpuKernels;
use modelfleet_engine::kv::{FreeListPool, KvCacheManager, NULL_BLOCK};
use modelfleet_engine::model::{Decoder, LogitsRows, SeqInput};
use modelfleet_testkit::gen_model::{GenDType, GenFormat, Shape};

const WINDOW: usize = 8;
const BS: usize = 4;
const LEN: usize = 48;

#[test]
fn window_groups_decode_exactly_as_one_prefill_while_giving_blocks_back() {
    let dir = common::generated(Shape::TinyGemma3, 3, GenDType::F32, GenFormat::Safetensors);
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["sliding_window"] = WINDOW.into();
    std::fs::write(&path, config.to_string()).unwrap();
    let md = ModelDir::open(dir.path()).unwrap();
    let kernels = CpuKernels::new(1);
    let model = Decoder::load(&kernels, md.config.clone(), &md.weights).unwrap();
    let groups = model.kv_groups().clone();
    assert!(groups.len() > 1, "tiny Gemma 3 has local and global layers");
    let vocab = md.config.vocab_size;
    let tokens: Vec<u32> = (0..LEN as u32)
        .map(|i| 1 + (i * 37) % (vocab as u32 - 1))
        .collect();

    // One prefill: every group holds every block.
    let blocks = LEN.div_ceil(BS) * groups.len();
    let mut kv = KvCacheManager::with_groups(FreeListPool::new(blocks), BS, &groups);
    let mut cache = model.new_kv_cache(&kernels, blocks, BS);
    let tables = kv.allocate_slots(0, 0, LEN).unwrap().to_vec();
    let seq = SeqInput {
        tokens: &tokens,
        start_pos: 0,
        block_tables: &tables,
        logits: LogitsRows::All,
        adapter: None,
    };
    let all = model
        .forward(&kernels, &[seq], &mut cache)
        .unwrap()
        .seq(0)
        .to_vec();

    // A token at a time, in a pool that holds the global group's whole context but only a window's
    // worth (plus a block) of each local group.
    let windowed = groups.windows().iter().filter(|w| w.is_some()).count();
    let full = groups.len() - windowed;
    let small = full * LEN.div_ceil(BS) + windowed * (WINDOW / BS + 2);
    assert!(small < blocks / 2, "{small} of {blocks} blocks");
    let mut kv = KvCacheManager::with_groups(FreeListPool::new(small), BS, &groups);
    let mut cache = model.new_kv_cache(&kernels, small, BS);
    let mut given_back = 0;
    for pos in 0..LEN {
        let tables = kv.allocate_slots(0, pos, 1).unwrap().to_vec();
        given_back = given_back.max(tables.iter().flatten().filter(|&&b| b == NULL_BLOCK).count());
        let seq = SeqInput {
            tokens: &tokens[pos..pos + 1],
            start_pos: pos,
            block_tables: &tables,
            logits: LogitsRows::Last,
            adapter: None,
        };
        let out = model.forward(&kernels, &[seq], &mut cache).unwrap();
        let row = out.last(0).unwrap();
        let want = &all[pos * vocab..(pos + 1) * vocab];
        assert!(
            row.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "position {pos}: decoding differs from the prefill"
        );
    }
    assert!(
        given_back >= windowed * (LEN - WINDOW) / BS - windowed,
        "{given_back} entries given back"
    );
}
