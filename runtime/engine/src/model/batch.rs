//! The plain data crossing the scheduler → model boundary for one step: a ragged batch of sequences,
//! each contributing one or more new tokens (a prefill chunk or a decode step) with its block tables,
//! and the logits that come back.
//!
//! Invariants: a sequence's new tokens sit at positions `start_pos..start_pos + tokens.len()`, and its
//! block tables cover all of them; logits come back only for the rows each sequence asked for, in batch
//! order, so the LM head (the largest matmul for small models) runs on as few rows as possible.

use std::ops::Range;

/// Which rows of a sequence need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsRows {
    /// None (an intermediate prefill chunk).
    None,
    /// The last new token's (the usual case: sample the next token).
    Last,
    /// Every new token's (prompt logprobs, tests against references).
    All,
}

/// One sequence's part of a step.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    /// The new tokens.
    pub tokens: &'a [u32],
    /// Tokens of this sequence already in the KV cache (vLLM's `num_computed_tokens`).
    pub start_pos: usize,
    /// Per KV-cache group ([`crate::kv::KvGroups`]), the block ids covering positions
    /// `0..start_pos + tokens.len()` (in a window group, those no new token sees may be
    /// [`crate::kv::NULL_BLOCK`]).
    pub block_tables: &'a [Vec<u32>],
    /// Which rows need logits.
    pub logits: LogitsRows,
    /// The LoRA adapter applied to this sequence's rows: an index into the step's adapter list, or
    /// `None` for the base model.
    pub adapter: Option<usize>,
}

/// Logits of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    /// Columns per row.
    pub vocab_size: usize,
    /// Rows, concatenated in batch order.
    pub data: Vec<f32>,
    /// For each sequence of the batch, its rows in `data` (empty when it asked for none).
    pub rows: Vec<Range<usize>>,
}

impl Logits {
    /// All rows of sequence `i`, concatenated.
    pub fn seq(&self, i: usize) -> &[f32] {
        let r = &self.rows[i];
        &self.data[r.start * self.vocab_size..r.end * self.vocab_size]
    }

    /// The last row of sequence `i`, if it asked for any.
    pub fn last(&self, i: usize) -> Option<&[f32]> {
        let r = &self.rows[i];
        (r.end > r.start).then(|| &self.data[(r.end - 1) * self.vocab_size..r.end * self.vocab_size])
    }
}
