//! LoRA in the forward pass, batched per row group (in the spirit of Punica's and S-LoRA's segmented
//! products, on CPU): after a projection's base matmul over the whole batch, each adapter present in
//! the step adds `scale · (X_g · Aᵀ) · Bᵀ` to the rows `g` of its sequences — two small matmuls per
//! adapter and target, never a merged weight per request.
//!
//! Invariants: the base matmul is the same whatever adapters are present, and an adapter's delta for a
//! row depends only on that row (the kernels are batch-invariant), so a request's logits are identical
//! alone or in a batch mixing the base model and other adapters; a target an adapter does not train
//! is left untouched.

use crate::lora::{LoraAdapter, Target};
use modelfleet_kernels::Kernels;

/// One target's `(A, B)` factors on the backend, per [`Target::ALL`] index.
type LayerFactors<K> = [Option<(<K as Kernels>::Weight, <K as Kernels>::Weight)>; 7];

/// An adapter's factors uploaded to a kernels backend, indexed by layer and target.
pub struct LoraWeights<K: Kernels> {
    /// [`LoraAdapter::id`] of the adapter these came from.
    pub id: u64,
    scale: f32,
    rank: usize,
    /// Per layer, per [`Target::ALL`] index: `(A, B)`.
    layers: Vec<LayerFactors<K>>,
}

impl<K: Kernels> LoraWeights<K> {
    /// Uploads `adapter`'s factors (a model with `num_layers` layers).
    pub fn upload(kernels: &K, adapter: &LoraAdapter, num_layers: usize) -> Self {
        let mut layers: Vec<LayerFactors<K>> = (0..num_layers).map(|_| Default::default()).collect();
        for (&(layer, target), pair) in &adapter.pairs {
            if let Some(slots) = layers.get_mut(layer) {
                slots[target_index(target)] = Some((kernels.upload(&pair.a), kernels.upload(&pair.b)));
            }
        }
        Self {
            id: adapter.id,
            scale: adapter.scale,
            rank: adapter.rank,
            layers,
        }
    }
}

fn target_index(t: Target) -> usize {
    Target::ALL.iter().position(|&x| x == t).expect("a target")
}

/// The rows of one step that use each adapter, and scratch space for the deltas.
pub(crate) struct LoraPlan<'a, K: Kernels> {
    groups: Vec<Group<'a, K>>,
    xa: K::Buf,
    t: K::Buf,
    d: K::Buf,
}

struct Group<'a, K: Kernels> {
    weights: &'a LoraWeights<K>,
    rows: Vec<usize>,
    /// The rows are exactly `0..total rows` (no gather needed).
    all: bool,
}

impl<'a, K: Kernels> LoraPlan<'a, K> {
    /// Groups rows by adapter: `row_adapter[r]` is row `r`'s index into `adapters`. `max_width` is the
    /// widest input or output of any projection.
    pub(crate) fn new(
        k: &K,
        adapters: &'a [&'a LoraWeights<K>],
        row_adapter: &[Option<usize>],
        max_width: usize,
    ) -> Self {
        let mut rows: Vec<Vec<usize>> = vec![Vec::new(); adapters.len()];
        for (r, a) in row_adapter.iter().enumerate() {
            if let Some(i) = *a {
                rows[i].push(r);
            }
        }
        let n = row_adapter.len();
        let groups: Vec<Group<'a, K>> = adapters
            .iter()
            .zip(rows)
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(w, rows)| Group {
                weights: w,
                all: rows.len() == n,
                rows,
            })
            .collect();
        let most = groups.iter().map(|g| g.rows.len()).max().unwrap_or(0);
        let rank = groups.iter().map(|g| g.weights.rank).max().unwrap_or(0);
        let gather = groups.iter().any(|g| !g.all);
        Self {
            xa: k.alloc(if gather { most * max_width } else { 0 }),
            t: k.alloc(most * rank),
            d: k.alloc(most * max_width),
            groups,
        }
    }

    /// Whether any row uses an adapter.
    pub(crate) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Adds each group's delta for `(layer, target)` to `out` (`rows × out_w`), its input being `x`
    /// (`rows × in_w`).
    pub(crate) fn apply(
        &mut self,
        k: &K,
        (layer, target): (usize, Target),
        x: (&K::Buf, usize),
        out: (&mut K::Buf, usize),
    ) {
        let ((x, in_w), (out, out_w)) = (x, out);
        let ti = target_index(target);
        for g in &self.groups {
            let Some((a, b)) = g.weights.layers.get(layer).and_then(|l| l[ti].as_ref()) else {
                continue;
            };
            let n = g.rows.len();
            let input = if g.all {
                x
            } else {
                k.gather_rows(x, in_w, &g.rows, &mut self.xa);
                &self.xa
            };
            k.matmul(input, n, a, None, &mut self.t);
            k.matmul(&self.t, n, b, None, &mut self.d);
            k.scatter_add_scaled(&self.d, out_w, &g.rows, g.weights.scale, out);
        }
    }
}
