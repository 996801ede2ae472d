//! A mixture-of-experts FFN (Qwen3-MoE): a router scores every expert per row, the softmax's `top_k`
//! largest are kept (renormalised to sum to 1 when the family says so), and each expert's SwiGLU runs
//! once per step on exactly the rows routed to it — gathered into one small matrix, so an expert's
//! weights are read once per step however many rows chose it (the batch-16 win that makes MoE worth
//! serving: 16 decode rows at top-2 of 8 experts read each expert's weights once, not 4 times). Its
//! output is added back to those rows scaled by their router weights.
//!
//! Invariants: routing is per row on the host in f32 and depends on nothing but that row's router
//! logits; a row's experts are accumulated in ascending expert order; every kernel used is
//! batch-invariant — so a sequence's logits are the same alone or in any batch, as for dense layers.

use modelfleet_kernels::Kernels;

/// One expert: a SwiGLU FFN.
pub(crate) struct Expert<K: Kernels> {
    pub gate: K::Weight,
    pub up: K::Weight,
    pub down: K::Weight,
}

/// A MoE layer's weights.
pub(crate) struct MoeFfn<K: Kernels> {
    /// `[num_experts, hidden]`.
    pub router: K::Weight,
    pub experts: Vec<Expert<K>>,
}

/// The rows each expert runs on and their router weights, per expert.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Routes {
    pub rows: Vec<Vec<usize>>,
    pub weights: Vec<Vec<f32>>,
}

/// Routes each row of `logits` (`rows × num_experts`, the router's output) to its `top_k` experts:
/// softmax over all experts, the `top_k` largest probabilities (ties to the lower index), divided by
/// their sum when `norm` — `transformers`' `Qwen3MoeSparseMoeBlock` and llama.cpp's `build_moe_ffn`.
pub(crate) fn route(logits: &[f32], num_experts: usize, top_k: usize, norm: bool) -> Routes {
    let mut routes = Routes {
        rows: vec![Vec::new(); num_experts],
        weights: vec![Vec::new(); num_experts],
    };
    let mut probs = vec![0.0f32; num_experts];
    let mut order: Vec<usize> = Vec::with_capacity(num_experts);
    for (r, row) in logits.chunks_exact(num_experts).enumerate() {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for (p, &x) in probs.iter_mut().zip(row) {
            *p = (x - max).exp();
            sum += *p;
        }
        probs.iter_mut().for_each(|p| *p /= sum);
        order.clear();
        order.extend(0..num_experts);
        // Stable: equal probabilities keep the lower expert first.
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let picked = &order[..top_k];
        let total: f32 = picked.iter().map(|&e| probs[e]).sum();
        for &e in picked {
            routes.rows[e].push(r);
            let w = if norm { probs[e] / total } else { probs[e] };
            routes.weights[e].push(w);
        }
    }
    routes
}

/// The buffers a MoE layer uses besides the FFN's gate/up/activation ones.
pub(crate) struct MoeBufs<'a, K: Kernels> {
    /// The layer's input (`rows × hidden`, normed).
    pub xn: &'a K::Buf,
    /// Router logits (`rows × num_experts`).
    pub router: &'a mut K::Buf,
    /// An expert's rows, gathered (`n × hidden`), and its output.
    pub expert_in: &'a mut K::Buf,
    pub expert_out: &'a mut K::Buf,
    pub gate: &'a mut K::Buf,
    pub up: &'a mut K::Buf,
    pub act: &'a mut K::Buf,
    /// The layer's output (`rows × hidden`).
    pub out: &'a mut K::Buf,
}

impl<K: Kernels> MoeFfn<K> {
    /// The layer on `rows` rows: `b.out = Σ_experts weight · expert(b.xn)`, each expert run once on its
    /// gathered rows.
    pub(crate) fn forward(
        &self,
        k: &K,
        rows: usize,
        (hidden, expert_ff): (usize, usize),
        (top_k, norm): (usize, bool),
        b: MoeBufs<'_, K>,
    ) {
        let n_exp = self.experts.len();
        k.matmul(b.xn, rows, &self.router, None, b.router);
        let mut logits = vec![0.0f32; rows * n_exp];
        k.read(b.router, &mut logits);
        let routes = route(&logits, n_exp, top_k, norm);
        k.zero(b.out, rows * hidden);
        for (e, ex) in self.experts.iter().enumerate() {
            let (sel, weights) = (&routes.rows[e], &routes.weights[e]);
            if sel.is_empty() {
                continue;
            }
            let n = sel.len();
            k.gather_rows(b.xn, hidden, sel, b.expert_in);
            k.matmul(b.expert_in, n, &ex.gate, None, b.gate);
            k.matmul(b.expert_in, n, &ex.up, None, b.up);
            k.silu_mul(b.gate, b.up, b.act, n * expert_ff);
            k.matmul(b.act, n, &ex.down, None, b.expert_out);
            k.scatter_add_weighted(b.expert_out, hidden, sel, weights, b.out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_go_to_their_top_k_experts_with_renormalised_weights() {
        // Row 0 prefers experts 2 then 0; row 1 experts 1 then 3; row 2 ties 0 and 3 (lower first).
        let logits = [1.0, -1.0, 2.0, 0.0, 0.0, 3.0, -2.0, 1.0, 0.5, 0.0, 0.0, 0.5];
        let r = route(&logits, 4, 2, true);
        assert_eq!(r.rows, vec![vec![0, 2], vec![1], vec![0], vec![1, 2]]);
        let softmax = |xs: &[f32]| {
            let s: f32 = xs.iter().map(|x| x.exp()).sum();
            xs.iter().map(|x| x.exp() / s).collect::<Vec<f32>>()
        };
        let p0 = softmax(&logits[0..4]);
        let w = p0[2] / (p0[2] + p0[0]);
        assert!((r.weights[2][0] - w).abs() < 1e-6);
        assert!((r.weights[0][0] - (1.0 - w)).abs() < 1e-6);
        assert!((r.weights[0][1] - 0.5).abs() < 1e-6 && (r.weights[3][1] - 0.5).abs() < 1e-6);
        // Without renormalisation the weights are the softmax's own.
        let raw = route(&logits, 4, 2, false);
        assert!((raw.weights[2][0] - p0[2]).abs() < 1e-6);
        // Every row's weights sum to 1 after renormalisation.
        for row in 0..3 {
            let s: f32 = (0..4)
                .flat_map(|e| {
                    r.rows[e]
                        .iter()
                        .zip(&r.weights[e])
                        .filter(move |(x, _)| **x == row)
                })
                .map(|(_, w)| w)
                .sum();
            assert!((s - 1.0).abs() < 1e-6, "row {row}: {s}");
        }
    }
}
