//! How a model's attention layers share the KV cache's blocks: KV-cache groups, as vLLM's hybrid
//! allocator forms them. Layers that attend alike (the whole context, or a sliding window of the same
//! width) are cut into groups of `width` layers; a block holds `width` layers' K and V for
//! `block_size` tokens, and every request has one block table per group, all drawing on one pool.
//! A sliding-window group gives a request's blocks back once no query can see them any more, so a
//! local layer holds about its window of tokens, not the whole context (Gemma 3: five of every six
//! layers).
//!
//! Invariants: every layer is in exactly one group, at one buffer index `< width`; a model whose
//! layers all attend alike has one group of all its layers (the layout before groups: a block holds
//! every layer); group order is fixed at load (full-attention groups first), so group `g`'s block
//! hashes are derived the same way on every step ([`super::BlockHash::for_group`]).
//!
//! Design: vLLM v1's `KVCacheGroupSpec`s with one page size (`kv_cache_utils.py`: layers of each
//! attention type cut into groups of the smallest type's layer count, padded) and its
//! `SlidingWindowManager`, which replaces blocks that left the window by a null block.

/// A block-table entry whose block was given back: its positions left every query's window.
pub const NULL_BLOCK: super::BlockId = super::BlockId::MAX;

/// The KV-cache groups of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGroups {
    width: usize,
    windows: Vec<Option<usize>>,
    /// Per layer: its group and its buffer within a block.
    layers: Vec<(usize, usize)>,
}

impl KvGroups {
    /// One group of `num_layers` full-attention layers.
    pub fn uniform(num_layers: usize) -> Self {
        Self::new(&vec![None; num_layers])
    }

    /// Groups for layers attending with `windows[l]` (`None`: the whole context). A window is the
    /// number of positions a query sees, itself included.
    pub fn new(windows: &[Option<usize>]) -> Self {
        let mut kinds: Vec<Option<usize>> = windows.to_vec();
        kinds.sort_unstable();
        kinds.dedup();
        let count = |k: &Option<usize>| windows.iter().filter(|w| *w == k).count();
        let width = kinds.iter().map(count).min().unwrap_or(0).max(1);
        let mut layers = vec![(0, 0); windows.len()];
        let mut group_windows = Vec::new();
        for kind in kinds {
            let members: Vec<usize> = (0..windows.len()).filter(|&l| windows[l] == kind).collect();
            for chunk in members.chunks(width) {
                for (j, &l) in chunk.iter().enumerate() {
                    layers[l] = (group_windows.len(), j);
                }
                group_windows.push(kind);
            }
        }
        Self {
            width,
            windows: group_windows,
            layers,
        }
    }

    /// Layers each block holds (the K and V buffers of the storage).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Groups: block tables per request.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Whether there is no group (a model without layers).
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Per group, its sliding window.
    pub fn windows(&self) -> &[Option<usize>] {
        &self.windows
    }

    /// Layer `l`'s group and buffer index.
    pub fn layer(&self, l: usize) -> (usize, usize) {
        self.layers[l]
    }

    /// The most blocks a request of `tokens` tokens holds at once, over all groups, when it is computed
    /// in steps of at most `step` tokens.
    pub fn blocks_for(&self, tokens: usize, step: usize, block_size: usize) -> usize {
        let bs = block_size.max(1);
        let full = tokens.div_ceil(bs);
        self.windows
            .iter()
            .map(|w| match w {
                None => full,
                Some(w) => full.min(window_blocks(*w, step, bs)),
            })
            .sum()
    }

    /// The longest request (tokens) whose blocks fit in `blocks` ([`Self::blocks_for`]).
    pub fn tokens_fitting(&self, blocks: usize, step: usize, block_size: usize) -> usize {
        let bs = block_size.max(1);
        let full = self.windows.iter().filter(|w| w.is_none()).count();
        if full == 0 {
            // Only windows: a request of any length holds at most its windows' blocks.
            return if self.blocks_for(usize::MAX / 2, step, bs) <= blocks {
                usize::MAX
            } else {
                // Short requests hold their whole length in every group.
                blocks / self.len().max(1) * bs
            };
        }
        // Monotone in the length: find the most whole blocks per table that fit.
        let (mut lo, mut hi) = (0usize, blocks);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.blocks_for(mid * bs, step, bs) <= blocks {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo * bs
    }

    /// KV bytes per token of a request of `tokens` tokens, counting each block's bytes once over the
    /// tokens it serves: `bytes_per_block` is one block's (every buffer of it, K and V).
    pub fn bytes_per_token_at(
        &self,
        tokens: usize,
        step: usize,
        block_size: usize,
        bytes_per_block: u64,
    ) -> f64 {
        let blocks = self.blocks_for(tokens, step, block_size) as f64;
        blocks * bytes_per_block as f64 / tokens.max(1) as f64
    }
}

/// The most blocks a window of `w` positions keeps alive while a step computes up to `step` new
/// positions: the first new query's window reaches `w − 1` positions back, the step's last position
/// `step − 1` ahead, and both ends may fall mid-block.
fn window_blocks(w: usize, step: usize, bs: usize) -> usize {
    (w.saturating_sub(1) + step.max(1)).div_ceil(bs) + 1
}

/// The first block a query at position `pos` still sees under a window of `w` (blocks before it
/// can be given back).
pub fn first_visible_block(pos: usize, w: usize, block_size: usize) -> usize {
    (pos + 1).saturating_sub(w) / block_size.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemma3_270m() -> KvGroups {
        // 18 layers, every sixth global (5, 11, 17), the rest local with a window of 512.
        let windows: Vec<_> = (0..18).map(|l| (l % 6 < 5).then_some(512)).collect();
        KvGroups::new(&windows)
    }

    #[test]
    fn layers_are_cut_into_groups_of_the_rarest_kind() {
        let g = gemma3_270m();
        assert_eq!(g.width(), 3);
        assert_eq!(g.len(), 6);
        assert_eq!(g.windows()[0], None, "full attention first");
        assert!(g.windows()[1..].iter().all(|w| *w == Some(512)));
        assert_eq!(g.layer(5), (0, 0));
        assert_eq!(g.layer(17), (0, 2));
        assert_eq!(g.layer(0), (1, 0));
        assert_eq!(g.layer(2), (1, 2));
        assert_eq!(g.layer(3), (2, 0));
        assert_eq!(g.layer(6), (2, 2), "the global layer 5 is not counted");
        let mut seen: Vec<_> = (0..18).map(|l| g.layer(l)).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 18, "every layer its own buffer");
        // Uneven counts pad the last group: 26 layers, 4 global (Gemma 3 1B).
        let w1b: Vec<_> = (0..26).map(|l| (l % 6 != 5).then_some(512)).collect();
        let g = KvGroups::new(&w1b);
        assert_eq!((g.width(), g.len()), (4, 1 + 6));
        let u = KvGroups::uniform(30);
        assert_eq!((u.width(), u.len(), u.layer(29)), (30, 1, (0, 29)));
    }

    #[test]
    fn a_window_group_holds_its_window_and_capacity_follows() {
        let g = gemma3_270m();
        let (bs, step) = (16, 16);
        // Short requests: every group holds all of their blocks.
        assert_eq!(g.blocks_for(100, step, bs), 6 * 7);
        // 8k tokens: the global group 512 blocks, each local one (511 + 16)/16 + 1 = 34.
        assert_eq!(g.blocks_for(8192, step, bs), 512 + 5 * 34);
        // 6 buffers per block are 3 layers, so a full allocation is 18/3 = 6 tables of 512.
        let full = 6 * 512;
        let ratio = full as f64 / g.blocks_for(8192, step, bs) as f64;
        assert!((4.4..4.6).contains(&ratio), "{ratio}");
        // The longest request that fits is the inverse.
        let blocks = g.blocks_for(8192, step, bs);
        assert_eq!(g.tokens_fitting(blocks, step, bs), 8192);
        assert!(g.tokens_fitting(blocks - 1, step, bs) < 8192);
        let u = KvGroups::uniform(4);
        assert_eq!(u.tokens_fitting(10, step, bs), 160);
        // A window on every layer: past its window a request never holds more.
        let mistral = KvGroups::new(&[Some(64); 4]);
        assert_eq!(mistral.tokens_fitting(1000, step, bs), usize::MAX);
        assert_eq!(mistral.tokens_fitting(2, step, bs), 32);
    }

    #[test]
    fn first_visible_block_follows_the_window() {
        assert_eq!(first_visible_block(0, 4, 4), 0);
        assert_eq!(first_visible_block(7, 4, 4), 1); // sees 4..=7
        assert_eq!(first_visible_block(8, 4, 4), 1); // sees 5..=8
        assert_eq!(first_visible_block(11, 4, 4), 2);
        assert_eq!(first_visible_block(3, 100, 4), 0);
    }
}
