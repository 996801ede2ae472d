//! Which query vectors of one paged-attention call walk the context together (`super`): a *walk* is
//! consecutive rows of one sequence × a piece of the query heads of one KV head. Rows of one sequence
//! at consecutive positions (a speculative verification chunk, a prefill chunk) walk their common
//! context together, so each cached key and value is loaded, widened and prefetched once for all of
//! them rather than once per row; walks are kept small enough that there are about two per thread
//! when the batch allows it (three long walks on two threads leave one idle half the time).
//!
//! Invariants: the walks cover every (row, query head) of the batch exactly once; a walk carries at
//! most [`MAX_VECTORS`] query vectors (rows × heads); its rows are consecutive rows of one sequence.
//! Which walk a row lands in changes nothing in its result (`super`'s header).

/// Most query vectors one walk carries (one accumulator register each in the score loop).
pub(super) const MAX_VECTORS: usize = 16;

/// One walk: rows `row..row + rows` of sequence `seq` (counted within the sequence) × query heads
/// `head..head + heads` of KV head `kv_head`'s group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Walk {
    pub seq: usize,
    pub row: usize,
    pub rows: usize,
    pub kv_head: usize,
    pub head: usize,
    pub heads: usize,
}

impl Walk {
    /// Query vectors carried: rows × heads.
    pub fn vectors(&self) -> usize {
        self.rows * self.heads
    }
}

/// The walks for sequences of `rows_per_seq` rows, `num_kv_heads` KV heads of `group` query heads
/// each, on `threads` threads: in sequence, KV head, head piece and row order.
pub(super) fn plan(rows_per_seq: &[usize], num_kv_heads: usize, group: usize, threads: usize) -> Vec<Walk> {
    // Query heads in near-equal pieces of at most MAX_VECTORS.
    let pieces = group.div_ceil(MAX_VECTORS).max(1);
    let piece = |i: usize| {
        let (base, extra) = (group / pieces, group % pieces);
        (i * base + i.min(extra), base + usize::from(i < extra))
    };
    let most_rows = MAX_VECTORS / group.div_ceil(pieces);
    let walks = |cap: usize| -> usize {
        rows_per_seq.iter().map(|&n| n.div_ceil(cap)).sum::<usize>() * num_kv_heads * pieces
    };
    // The most rows a walk may take: the largest that still leaves two walks a thread, if any does.
    let mut cap = most_rows.max(1);
    while cap > 1 && walks(cap) < 2 * threads {
        cap -= 1;
    }
    let mut out = Vec::with_capacity(walks(cap));
    for (seq, &n) in rows_per_seq.iter().enumerate() {
        // Near-equal row groups of at most `cap` rows.
        let groups = n.div_ceil(cap);
        for kv_head in 0..num_kv_heads {
            for p in 0..pieces {
                let (head, heads) = piece(p);
                let mut row = 0;
                for g in 0..groups {
                    let rows = n / groups + usize::from(g < n % groups);
                    out.push(Walk {
                        seq,
                        row,
                        rows,
                        kv_head,
                        head,
                        heads,
                    });
                    row += rows;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (sequence, row, KV head, head) once, no walk over MAX_VECTORS.
    fn check(rows_per_seq: &[usize], kv: usize, group: usize, threads: usize) -> Vec<Walk> {
        let walks = plan(rows_per_seq, kv, group, threads);
        let mut seen = std::collections::HashSet::new();
        for w in &walks {
            assert!(w.rows >= 1 && w.heads >= 1 && w.vectors() <= MAX_VECTORS, "{w:?}");
            for r in w.row..w.row + w.rows {
                for h in w.head..w.head + w.heads {
                    assert!(r < rows_per_seq[w.seq] && h < group && w.kv_head < kv, "{w:?}");
                    assert!(seen.insert((w.seq, r, w.kv_head, h)), "twice: {w:?}");
                }
            }
        }
        let total: usize = rows_per_seq.iter().sum::<usize>() * kv * group;
        assert_eq!(seen.len(), total, "{rows_per_seq:?} {kv}x{group} on {threads}");
        walks
    }

    #[test]
    fn covers_every_row_and_head_once() {
        for threads in [1, 2, 4] {
            for group in [1, 2, 3, 4, 7, 8, 16, 17, 40] {
                for rows in [vec![1], vec![5], vec![9, 1, 3], vec![512], vec![1; 16]] {
                    check(&rows, 3, group, threads);
                }
            }
        }
    }

    #[test]
    fn verification_rows_share_walks_as_far_as_threads_allow() {
        // One sequence verifying 4 drafts (5 rows), 3 KV heads of 3 query heads: one walk of all 5
        // rows per KV head on one thread; on two, two walks per KV head (3 + 2 rows) so that both
        // threads have work.
        let one = check(&[5], 3, 3, 1);
        assert_eq!(one.len(), 3);
        assert!(one.iter().all(|w| w.rows == 5 && w.vectors() == 15));
        let two = check(&[5], 3, 3, 2);
        assert_eq!(two.iter().map(|w| w.rows).collect::<Vec<_>>(), [3, 2, 3, 2, 3, 2]);
        // Plain decode: one row per walk whatever the threads.
        assert!(
            check(&[1, 1, 1, 1], 3, 3, 2)
                .iter()
                .all(|w| w.rows == 1 && w.heads == 3)
        );
        // A long prefill chunk: as many rows as fit (5 × 3 heads = 15 vectors).
        assert!(check(&[512], 3, 3, 2).iter().all(|w| w.rows >= 4 && w.rows <= 5));
        // Groups over MAX_VECTORS run in near-equal pieces, one row each.
        let big = check(&[2], 1, 40, 1);
        assert!(big.iter().all(|w| w.rows == 1 && (13..=14).contains(&w.heads)));
    }
}
