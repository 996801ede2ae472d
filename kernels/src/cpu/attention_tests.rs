//! Tests of the paged attention kernels (`super`): the dense reference on every cache element type and
//! every ISA, identical bits across ISAs, and a row alone against the same row in a prefill chunk
//! (whose rows share walks of the context, split differently on 1, 2 and 3 threads).

use super::*;

/// Values in [-2, 2).
fn lcg(seed: u64, n: usize) -> Vec<f32> {
    crate::cpu::test_data::lcg(seed, n)
        .into_iter()
        .map(|v| v * 4.0)
        .collect()
}

/// Dense reference: full softmax over positions 0..=pos, in f64.
fn reference(q: &[f32], keys: &[Vec<f32>], vals: &[Vec<f32>], scale: f32) -> Vec<f32> {
    let s: Vec<f64> = keys
        .iter()
        .map(|k| q.iter().zip(k).map(|(a, b)| (a * b) as f64).sum::<f64>() * scale as f64)
        .collect();
    let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
    let z: f64 = e.iter().sum();
    (0..q.len())
        .map(|d| (e.iter().zip(vals).map(|(p, v)| p * v[d] as f64).sum::<f64>() / z) as f32)
        .collect()
}

fn isas() -> Vec<Isa> {
    let mut v = vec![Isa::Portable];
    if Isa::detect().has_avx2() {
        v.push(Isa::Avx2);
    }
    if Isa::detect() == Isa::Avx512 {
        v.push(Isa::Avx512);
    }
    v
}

/// The key (transposed layout) and value of position `p` of KV head `h` under `table`.
fn key_val(
    l: &KvLayout,
    (kc, vc): (&[f32], &[f32]),
    table: &[u32],
    h: usize,
    p: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (block, slot) = (table[p / l.block_size] as usize, p % l.block_size);
    let k0 = l.key_offset(block, h, slot);
    let v0 = l.offset(block, h, slot);
    let si = l.scale_offset(block, h, slot);
    (
        (0..l.head_dim)
            .map(|d| elem(l, kc, k0 + d * l.block_size, si))
            .collect(),
        (0..l.head_dim).map(|d| elem(l, vc, v0 + d, si)).collect(),
    )
}

/// A cache buffer of random values in the layout's element type.
fn random_cache(l: &KvLayout, seed: u64) -> Vec<f32> {
    let vals = lcg(seed, l.len());
    match l.dtype {
        KvDType::F32 => vals,
        KvDType::F16 => {
            let mut buf = vec![0.0f32; l.storage_words()];
            let bits: &mut [u16] = bytemuck::cast_slice_mut(&mut buf);
            for (b, v) in bits.iter_mut().zip(&vals) {
                *b = half::f16::from_f32(*v).to_bits();
            }
            buf
        }
        KvDType::Q8_0 => {
            // Every slot written as the engine writes it: each head vector quantized with its scale.
            let (mut buf, mut other) = (vec![0.0f32; l.storage_words()], vec![0.0f32; l.storage_words()]);
            let slots: Vec<u32> = (0..(l.num_blocks * l.block_size) as u32).collect();
            crate::cpu::elementwise::write_kv(&vals, &vals, &slots, l, &mut buf, &mut other);
            buf
        }
    }
}

/// Element `i` of a cache buffer, as f32 (`si`: the index of its vector's scale, 8-bit caches).
fn elem(l: &KvLayout, buf: &[f32], i: usize, si: usize) -> f32 {
    match l.dtype {
        KvDType::F32 => buf[i],
        KvDType::F16 => half::f16::from_bits(bytemuck::cast_slice::<f32, u16>(buf)[i]).to_f32(),
        KvDType::Q8_0 => {
            let (q, scales) = crate::cpu::kv_q8::parts(l, buf);
            crate::cpu::kv_q8::dequantize(q[i], scales[si])
        }
    }
}

/// The cache layout (`num_blocks` blocks) and head layout of one of [`SHAPES`].
fn shape(
    (num_heads, num_kv_heads, head_dim, block_size): (usize, usize, usize, usize),
    dtype: KvDType,
    num_blocks: usize,
    scale: f32,
) -> (KvLayout, AttnHeads) {
    (
        KvLayout {
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype,
        },
        AttnHeads {
            num_heads,
            num_kv_heads,
            head_dim,
            scale,
            window: None,
        },
    )
}

/// Sliding windows tried: none, shorter than a block, and one that starts mid-chunk several blocks back.
fn windows(bs: usize) -> [Option<usize>; 3] {
    [None, Some(3), Some(3 * bs + 2)]
}

/// Every shape with every cache element type.
fn cases() -> impl Iterator<Item = ((usize, usize, usize, usize), KvDType)> {
    SHAPES
        .into_iter()
        .flat_map(|s| [(s, KvDType::F32), (s, KvDType::F16), (s, KvDType::Q8_0)])
}

/// Shapes: (query heads, KV heads, head_dim, block_size). Covers whole-register key groups (16),
/// blocks smaller than a register or not a multiple of it (4, 5, 8: the key-by-key path), head sizes
/// with a scalar tail (20, 24), query-head pieces (7 per KV head = 4 + 3) and no grouping.
const SHAPES: [(usize, usize, usize, usize); 6] = [
    (4, 2, 8, 4),
    (9, 3, 64, 16),
    (14, 2, 64, 16),
    (2, 1, 24, 8),
    (8, 8, 128, 32),
    (6, 2, 20, 5),
];

#[test]
fn matches_dense_softmax_attention_and_every_isa_gives_the_same_bits() {
    for (((num_heads, num_kv_heads, hd, bs), dtype), window) in
        cases().flat_map(|c| windows(c.0.3).map(|w| (c, w)))
    {
        let (layout, mut heads) = shape(
            (num_heads, num_kv_heads, hd, bs),
            dtype,
            24,
            1.0 / (hd as f32).sqrt(),
        );
        heads.window = window;
        // Random everywhere: stale entries outside the sequences must not matter.
        let (kc, vc) = (random_cache(&layout, 7), random_cache(&layout, 8));
        let table_a: Vec<u32> = (0..12).map(|i| (i * 7 + 3) % 24).collect();
        let table_b: Vec<u32> = (0..12).map(|i| (i * 5 + 1) % 24).collect();
        let ctx = 12 * bs;
        // A 7-row prefill chunk ending at the last position of A, and one decode row of B.
        let seqs = [
            AttnSeq {
                row_start: 0,
                num_rows: 7,
                first_pos: ctx - 7,
                block_table: &table_a,
            },
            AttnSeq {
                row_start: 7,
                num_rows: 1,
                first_pos: ctx / 2 + 1,
                block_table: &table_b,
            },
        ];
        let width = num_heads * hd;
        let q = lcg(9, 8 * width);
        let mut first: Option<Vec<f32>> = None;
        for isa in isas() {
            let mut out = vec![f32::NAN; 8 * width];
            paged_attention(isa, &q, &seqs, heads, &layout, (&kc, &vc), &mut out);
            for r in 0..8 {
                let (table, pos) = if r < 7 {
                    (&table_a, ctx - 7 + r)
                } else {
                    (&table_b, ctx / 2 + 1)
                };
                for h in 0..num_heads {
                    let kvh = h / (num_heads / num_kv_heads);
                    let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    let (keys, vals): (Vec<_>, Vec<_>) = (lo..=pos)
                        .map(|p| key_val(&layout, (&kc, &vc), table, kvh, p))
                        .unzip();
                    let at = r * width + h * hd;
                    let want = reference(&q[at..at + hd], &keys, &vals, heads.scale);
                    for (d, (a, b)) in out[at..at + hd].iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() < 1e-4,
                            "{isa:?} {dtype:?} {num_heads}/{num_kv_heads} hd {hd} bs {bs} window {window:?} row {r} head {h} dim {d}: {a} vs {b}"
                        );
                    }
                }
            }
            // The vector ISAs run the same chains in 8 or 16 lanes: identical bits.
            if isa != Isa::Portable {
                match &first {
                    None => first = Some(out),
                    Some(f) => assert!(
                        f.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?} differs from AVX2 ({dtype:?} {num_heads}/{num_kv_heads} hd {hd} bs {bs})"
                    ),
                }
            }
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_alone_as_in_a_prefill_chunk() {
    for (((num_heads, num_kv_heads, hd, bs), dtype), window) in
        cases().flat_map(|c| windows(c.0.3).map(|w| (c, w)))
    {
        let (layout, mut heads) = shape((num_heads, num_kv_heads, hd, bs), dtype, 10, 0.2);
        heads.window = window;
        let (kc, vc) = (random_cache(&layout, 11), random_cache(&layout, 12));
        let table: Vec<u32> = (0..10).rev().collect();
        let width = num_heads * hd;
        let rows = 9;
        let first_pos = 10 * bs - rows;
        let q = lcg(13, rows * width);
        // On 1–3 threads the chunk's rows share walks differently (`attention_plan.rs`).
        for (isa, threads) in isas().into_iter().flat_map(|i| [(i, 1), (i, 2), (i, 3)]) {
            let mut chunk = vec![0.0; rows * width];
            let seqs = [AttnSeq {
                row_start: 0,
                num_rows: rows,
                first_pos,
                block_table: &table,
            }];
            let pool = pool::Pool::new(threads);
            pool.scope(|| paged_attention(isa, &q, &seqs, heads, &layout, (&kc, &vc), &mut chunk));
            for r in 0..rows {
                let mut alone = vec![0.0; width];
                let one = [AttnSeq {
                    row_start: 0,
                    num_rows: 1,
                    first_pos: first_pos + r,
                    block_table: &table,
                }];
                paged_attention(
                    isa,
                    &q[r * width..(r + 1) * width],
                    &one,
                    heads,
                    &layout,
                    (&kc, &vc),
                    &mut alone,
                );
                assert!(
                    alone
                        .iter()
                        .zip(&chunk[r * width..])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa:?} on {threads} threads, {dtype:?} {num_heads}/{num_kv_heads} hd {hd} bs {bs} window {window:?} row {r}"
                );
            }
        }
    }
}
