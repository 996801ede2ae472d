//! The activation buffers of a forward pass, kept from step to step.
//!
//! A step used to allocate its buffers afresh; the multi-megabyte ones (the logits of a 16-sequence
//! decode step are 3 MB on a 49k vocabulary, a 512-token prefill's MLP buffers 3 MB each) came back from
//! the allocator as new pages, so every step paid a page fault and a zeroing per 4 KiB page: about 1,900
//! faults per decode step on the SmolLM2-135M shape, a few percent of the step.
//!
//! Invariants: a buffer handed out holds at least the elements asked for; its contents are whatever the
//! last step left there, which is sound because every kernel writes its output before anything reads it
//! (the model never reads a buffer it has not written in the same step). Buffers only grow, up to the
//! largest step seen (bounded by `max_num_batched_tokens` rows), as a per-step allocation's peak was; the
//! serving loop releases them whenever it runs out of work, so memory at rest does not keep a burst's peak.

use super::config::ModelConfig;
use modelfleet_kernels::Kernels;

/// The step's buffers, by scratch slot. The first [`ROW_SLOTS`] are per batch row; the last three are
/// the logits path's, per logits row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The residual stream.
    X,
    /// The normed residual (a projection's input).
    Xn,
    Q,
    K,
    V,
    /// Queries after the per-head norm (families with q/k norms; zero-width otherwise).
    Qn,
    /// Keys after the per-head norm.
    Kn,
    /// Attention output.
    Attn,
    /// A projection's output (attention or FFN) before the residual add.
    Proj,
    Gate,
    Up,
    /// The gated activation.
    Act,
    /// MoE router logits (MoE models only; zero-width otherwise).
    Router,
    /// An expert's rows, gathered, and its output.
    ExpertIn,
    ExpertOut,
    /// Rows that asked for logits, gathered.
    Sel,
    /// Those, normed.
    SelNorm,
    /// The logits on the backend.
    Logits,
}

/// Slots sized per batch row.
pub(crate) const ROW_SLOTS: usize = 15;

/// Per-row widths (in f32 elements) of the step's activation slots, in [`Slot`] order up to
/// [`ROW_SLOTS`]. [`super::Decoder`] takes its buffers with these widths, and [`workspace_bytes`]
/// sizes memory with the same ones.
pub(crate) fn row_widths(c: &ModelConfig) -> [usize; ROW_SLOTS] {
    let (h, ff) = (c.hidden_size, c.ffn_width());
    let (q_w, kv_w) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let (qn_w, kn_w) = if c.qk_norm { (q_w, kv_w) } else { (0, 0) };
    let (router, expert) = match &c.moe {
        Some(m) => (m.num_experts, h),
        None => (0, 0),
    };
    [
        h, h, q_w, kv_w, kv_w, qn_w, kn_w, q_w, h, ff, ff, ff, router, expert, expert,
    ]
}

/// The most memory a step's buffers take (bytes): the activation slots for `max_batched_tokens` rows,
/// the logits path (two hidden-wide rows, the backend's logits and their host copy) for one row per
/// sequence, and LoRA's per-group buffers at `max_lora_rank`. What a memory-sized KV pool leaves for
/// them (`kv::sizing`).
pub fn workspace_bytes(
    c: &ModelConfig,
    max_batched_tokens: usize,
    max_num_seqs: usize,
    max_lora_rank: usize,
) -> u64 {
    let rows = max_batched_tokens as u64;
    let logit_rows = max_num_seqs.min(max_batched_tokens) as u64;
    let activations: u64 = row_widths(c).iter().map(|&w| w as u64).sum::<u64>() * rows;
    let logits = logit_rows * (2 * c.hidden_size as u64 + 2 * c.vocab_size as u64);
    let widest = c.hidden_size.max(c.num_heads * c.head_dim).max(c.ffn_width()) as u64;
    let lora = rows * (2 * widest + max_lora_rank as u64);
    4 * (activations + logits + lora)
}

/// Reusable buffers by slot, each with its length in elements, and the host copy of the logits.
pub(crate) struct Scratch<K: Kernels> {
    slots: Vec<(Option<K::Buf>, usize)>,
    host: Vec<f32>,
}

impl<K: Kernels> Default for Scratch<K> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            host: Vec::new(),
        }
    }
}

impl<K: Kernels> Scratch<K> {
    /// The buffer of slot `i`, with at least `len` elements (a new zeroed one when the kept one is
    /// shorter); give it back with [`Scratch::put`].
    pub(crate) fn take(&mut self, k: &K, i: usize, len: usize) -> K::Buf {
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || (None, 0));
        }
        let slot = &mut self.slots[i];
        match slot.0.take() {
            Some(buf) if slot.1 >= len => buf,
            _ => {
                slot.1 = len;
                k.alloc(len)
            }
        }
    }

    /// Keeps `buf` as slot `i`'s buffer again.
    pub(crate) fn put(&mut self, i: usize, buf: K::Buf) {
        self.slots[i].0 = Some(buf);
    }

    /// A zeroed host vector of `len` elements for the logits (the capacity of the last one reused).
    pub(crate) fn host(&mut self, len: usize) -> Vec<f32> {
        let mut v = std::mem::take(&mut self.host);
        v.clear();
        v.resize(len, 0.0);
        v
    }

    /// Takes back a host vector [`Scratch::host`] gave out.
    pub(crate) fn recycle_host(&mut self, v: Vec<f32>) {
        if v.capacity() > self.host.capacity() {
            self.host = v;
        }
    }
}
