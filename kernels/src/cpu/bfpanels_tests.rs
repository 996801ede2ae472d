use super::*;
use crate::cpu::test_data::lcg;

/// `rows × k` activations and `n × k` weights of `dtype` with a bias, as the tests use them.
fn case(rows: usize, k: usize, n: usize, dtype: DType) -> (Vec<f32>, HostWeight, HostWeight) {
    let x = lcg(3, rows * k);
    let w = HostWeight::from_f32_as(&lcg(4, n * k), n, k, dtype).unwrap();
    let b = HostWeight::from_f32(&lcg(5, n), 1, n).unwrap();
    (x, w, b)
}

#[test]
fn panels_hold_the_weights_rounded_to_bf16() {
    let pool = pool::Pool::new(2);
    for dtype in [DType::F16, DType::BF16] {
        for (k, n) in [(1, 16), (5, 17), (64, 40), (577, 33)] {
            let (_, w, _) = case(1, k, n, dtype);
            let p = pool.scope(|| BfPanels::pack(&w)).unwrap();
            let mut src = vec![0.0; n * k];
            w.data().copy_to_f32(0, &mut src);
            let want: Vec<f32> = src.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
            let mut back = vec![0.0; n * k];
            p.to_host().data().copy_to_f32(0, &mut back);
            assert_eq!(back, want, "{dtype} {n}x{k}: to_host");
            let mut row = vec![0.0; k];
            for j in [0, n / 2, n - 1] {
                p.row_to_f32(j, &mut row);
                assert_eq!(row, want[j * k..(j + 1) * k], "{dtype} {n}x{k}: row {j}");
            }
            if dtype == DType::BF16 {
                assert_eq!(want, src, "bf16 weights are held exactly");
            }
        }
    }
    let f32w = HostWeight::from_f32(&lcg(6, 16 * 8), 16, 8).unwrap();
    assert!(BfPanels::pack(&f32w).is_none(), "f32 stays on the f32 tiles");
    let few = HostWeight::from_f32_as(&lcg(6, 15 * 8), 15, 8, DType::F16).unwrap();
    assert!(BfPanels::pack(&few).is_none(), "fewer rows than a panel");
}

#[test]
fn products_match_bf16_inputs_in_f64_and_every_row_alone_gives_the_same_bits() {
    if !supported() {
        eprintln!("skipped: no AVX-512 BF16 here");
        return;
    }
    for threads in [1, 3] {
        let pool = pool::Pool::new(threads);
        for &(rows, k, n) in &[
            (1, 2, 16),
            (3, 63, 17),
            (8, 64, 48),
            (9, 576, 33),
            (13, 96, 40),
            (20, 1536, 50),
            (64, 33, 100),
        ] {
            let (x, w, b) = case(rows, k, n, DType::F16);
            let p = pool.scope(|| BfPanels::pack(&w)).unwrap();
            let mut ours = vec![f32::NAN; rows * n];
            pool.scope(|| matmul(&x, rows, &p, Some(b.data()), &mut ours));
            let mut wr = vec![0.0; n * k];
            p.to_host().data().copy_to_f32(0, &mut wr);
            let xr: Vec<f64> = x.iter().map(|&v| f64::from(bf16::from_f32(v).to_f32())).collect();
            let mut bias = vec![0.0; n];
            b.data().copy_to_f32(0, &mut bias);
            let label = format!("{rows}x{k}x{n}, {threads} threads");
            for (i, got) in ours.iter().enumerate() {
                let (r, c) = (i / n, i % n);
                let terms = (0..k).map(|j| xr[r * k + j] * f64::from(wr[c * k + j]));
                let (sum, size) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                let want = sum + f64::from(bias[c]);
                assert!(
                    (f64::from(*got) - want).abs() <= 1e-6 * (1.0 + size) * (k as f64).sqrt(),
                    "{label} at {i}: {got} vs {want}"
                );
            }
            for r in 0..rows {
                let mut alone = vec![0.0; n];
                pool.scope(|| matmul(&x[r * k..(r + 1) * k], 1, &p, Some(b.data()), &mut alone));
                assert!(
                    alone
                        .iter()
                        .zip(&ours[r * n..(r + 1) * n])
                        .all(|(a, o)| a.to_bits() == o.to_bits()),
                    "{label}: row {r} alone differs"
                );
            }
        }
    }
}

#[test]
fn activations_round_to_nearest_even_pairs() {
    if !supported() {
        eprintln!("skipped: no AVX-512 BF16 here");
        return;
    }
    for len in [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 100] {
        let x: Vec<f32> = lcg(9, len).iter().map(|v| v * 3.7).collect();
        let mut got = vec![0xdead_beef_u32; len.div_ceil(2)];
        // SAFETY: the extensions were checked above; `got` holds ⌈len / 2⌉ pairs.
        unsafe { x86::to_bf16_pairs(&x, &mut got) };
        for (t, pair) in got.iter().enumerate() {
            let lo = bf16::from_f32(x[2 * t]).to_bits();
            let hi = x.get(2 * t + 1).map_or(0, |&v| bf16::from_f32(v).to_bits());
            assert_eq!(*pair, u32::from(lo) | u32::from(hi) << 16, "len {len}, pair {t}");
        }
    }
}
