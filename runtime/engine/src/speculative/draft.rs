//! The draft-model proposer's bookkeeping: its own paged KV cache (block tables over a
//! [`FreeListPool`]; the storage and weights live in the [`crate::Engine`], which runs the passes) and
//! one drafting round at a time.
//!
//! A round drafts for every speculating sequence of a step together, one batched forward pass per
//! draft position: pass 0 catches each sequence's draft cache up on its committed tokens (the whole
//! prompt the first time, afterwards the tokens accepted since) and yields the first draft from the
//! last row; pass `i` feeds draft `i` and yields draft `i + 1`. A sequence asking for `k` drafts needs
//! `k` passes and KV for `len + k - 1` positions (the last draft is never fed).
//!
//! Invariants: a sequence's draft cache holds, at positions `0..computed`, KV of its committed tokens
//! only — after verification [`DraftKv::rollback`] cuts it back to the tokens the target accepted
//! (freeing whole blocks past them); a sequence that ends or is preempted is [`DraftKv::release`]d;
//! when blocks run out, the draft caches of sequences not drafting in this round are dropped first
//! (they catch up again later), so the round's first sequence always gets its blocks.

use crate::kv::{BlockPool, FreeListPool, KvCacheManager, KvGroups, RequestId};
use crate::model::{Logits, LogitsRows, SeqInput};
use crate::sequence::DraftToken;
use std::collections::{HashMap, HashSet};

/// The draft model's block tables.
pub struct DraftKv {
    kv: KvCacheManager<FreeListPool>,
    /// Per sequence: leading positions whose draft KV is that of its committed tokens.
    computed: HashMap<RequestId, usize>,
    /// Per sequence holding a table: positions written by its last round (committed tokens and fed
    /// drafts).
    written: HashMap<RequestId, usize>,
}

/// One sequence's part of a round.
struct Job {
    id: RequestId,
    /// Committed tokens not yet in its draft cache (fed in pass 0).
    catch_up: Vec<u32>,
    /// Position of `catch_up[0]`.
    start: usize,
    /// Drafts wanted.
    k: usize,
    drafts: Vec<DraftToken>,
}

impl Job {
    /// Committed tokens of the sequence.
    fn len(&self) -> usize {
        self.start + self.catch_up.len()
    }
}

/// What a sequence wants drafted in a round.
pub struct DraftWant<'a> {
    /// Which sequence.
    pub id: RequestId,
    /// Its committed tokens (prompt then output).
    pub tokens: &'a [u32],
    /// Drafts wanted (>= 1).
    pub k: usize,
}

/// A drafting round in progress.
pub struct DraftRound {
    jobs: Vec<Job>,
    pass: usize,
}

impl DraftKv {
    /// Tables over `num_blocks` blocks of `block_size` tokens (the engine's draft storage).
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self::with_groups(num_blocks, block_size, &KvGroups::uniform(1))
    }

    /// [`Self::new`] for a draft model with KV-cache `groups`.
    pub fn with_groups(num_blocks: usize, block_size: usize, groups: &KvGroups) -> Self {
        Self {
            kv: KvCacheManager::with_groups(FreeListPool::new(num_blocks), block_size, groups),
            computed: HashMap::new(),
            written: HashMap::new(),
        }
    }

    /// Starts a round for `wants`, allocating each sequence's draft KV; a sequence that cannot get
    /// blocks (even after idle sequences' draft caches were dropped) is left out — see
    /// [`DraftRound::drafts`].
    pub fn plan(&mut self, wants: &[DraftWant<'_>]) -> DraftRound {
        let drafting: HashSet<RequestId> = wants.iter().map(|w| w.id).collect();
        let mut jobs = Vec::with_capacity(wants.len());
        for w in wants {
            let len = w.tokens.len();
            // At least the last committed token is fed: its row gives the first draft.
            let start = self.computed.get(&w.id).copied().unwrap_or(0).min(len - 1);
            let need = len + w.k - 1;
            if self.kv.allocate_slots(w.id, 0, need).is_err() {
                self.evict_except(&drafting);
                if self.kv.allocate_slots(w.id, 0, need).is_err() {
                    continue;
                }
            }
            self.computed.insert(w.id, start);
            self.written.insert(w.id, start);
            jobs.push(Job {
                id: w.id,
                catch_up: w.tokens[start..].to_vec(),
                start,
                k: w.k,
                drafts: Vec::with_capacity(w.k),
            });
        }
        DraftRound { jobs, pass: 0 }
    }

    /// Drops the draft caches of sequences not in `keep`.
    fn evict_except(&mut self, keep: &HashSet<RequestId>) {
        let idle: Vec<RequestId> = self
            .written
            .keys()
            .filter(|id| !keep.contains(id))
            .copied()
            .collect();
        idle.into_iter().for_each(|id| self.release(id));
    }

    /// The model inputs of the round's next pass (sequences still drafting, in round order).
    pub fn inputs<'a>(&'a self, round: &'a DraftRound) -> Vec<SeqInput<'a>> {
        round
            .active()
            .map(|j| {
                let (tokens, start_pos) = match round.pass {
                    0 => (j.catch_up.as_slice(), j.start),
                    p => (std::slice::from_ref(&j.drafts[p - 1].token), j.len() + p - 1),
                };
                SeqInput {
                    tokens,
                    start_pos,
                    block_tables: self.kv.block_tables(j.id),
                    logits: LogitsRows::Last,
                    adapter: None,
                }
            })
            .collect()
    }

    /// Takes a pass's `logits` (one row per input of [`Self::inputs`]): `propose(id, row, drafted)`
    /// turns each row into the next draft. Returns whether another pass is needed.
    pub fn absorb(
        &mut self,
        round: &mut DraftRound,
        logits: &Logits,
        mut propose: impl FnMut(RequestId, &[f32], &[u32]) -> DraftToken,
    ) -> bool {
        let pass = round.pass;
        for (i, j) in round.jobs.iter_mut().filter(|j| j.k > pass).enumerate() {
            let Some(row) = logits.last(i) else { continue };
            let drafted: Vec<u32> = j.drafts.iter().map(|d| d.token).collect();
            j.drafts.push(propose(j.id, row, &drafted));
            // Pass p wrote positions up to len + p - 1 (the catch-up, or draft p).
            self.written.insert(j.id, j.len() + pass);
            self.computed.insert(j.id, j.len());
        }
        round.pass += 1;
        round.active().next().is_some()
    }

    /// Ends a round whose pass failed: its sequences' draft caches are dropped (their content is
    /// unknown) and nothing is proposed.
    pub fn abandon(&mut self, round: DraftRound) {
        round.jobs.iter().for_each(|j| self.release(j.id));
    }

    /// After verification: `valid` leading tokens of `id` are committed and were scored by the target
    /// with the same tokens the draft cache holds; keeps at most those, freeing whole blocks past them.
    pub fn rollback(&mut self, id: RequestId, valid: usize) {
        let Some(&written) = self.written.get(&id) else {
            return;
        };
        let keep = written.min(valid);
        self.computed.insert(id, keep);
        self.written.insert(id, keep);
        self.kv.truncate(id, keep);
    }

    /// Frees `id`'s draft cache (it finished, was preempted, or is being evicted).
    pub fn release(&mut self, id: RequestId) {
        self.kv.free(id);
        self.computed.remove(&id);
        self.written.remove(&id);
    }

    /// Committed tokens of a sequence with `len` of them that its next round would feed beyond the
    /// last one (its catch-up).
    pub fn behind(&self, id: RequestId, len: usize) -> usize {
        let start = self.computed.get(&id).copied().unwrap_or(0);
        len.saturating_sub(1).saturating_sub(start)
    }

    /// `id`'s draft block table of group 0 (empty if it has none).
    pub fn block_table(&self, id: RequestId) -> &[crate::kv::BlockId] {
        self.kv.block_table(id)
    }

    /// `id`'s draft block tables, one per group.
    pub fn block_tables(&self, id: RequestId) -> &[Vec<crate::kv::BlockId>] {
        self.kv.block_tables(id)
    }

    /// Blocks held by draft caches.
    pub fn blocks_in_use(&self) -> usize {
        self.kv.pool().num_blocks() - self.kv.pool().num_free()
    }
}

impl DraftRound {
    fn active(&self) -> impl Iterator<Item = &Job> {
        self.jobs.iter().filter(|j| j.k > self.pass)
    }

    /// Whether every pass ran (or there was nothing to draft).
    pub fn is_done(&self) -> bool {
        self.active().next().is_none()
    }

    /// The drafts of each sequence that took part, in round order.
    pub fn drafts(self) -> Vec<(RequestId, Vec<DraftToken>)> {
        self.jobs.into_iter().map(|j| (j.id, j.drafts)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(rows: usize, vocab: usize, fill: impl Fn(usize) -> usize) -> Logits {
        let mut data = vec![0.0; rows * vocab];
        for r in 0..rows {
            data[r * vocab + fill(r)] = 1.0;
        }
        Logits {
            vocab_size: vocab,
            data,
            rows: (0..rows).map(|r| r..r + 1).collect(),
        }
    }

    fn argmax(_: RequestId, row: &[f32], _: &[u32]) -> DraftToken {
        let token = row.iter().position(|&x| x == 1.0).unwrap() as u32;
        DraftToken { token, q: None }
    }

    #[test]
    fn a_round_catches_up_drafts_and_rolls_back() {
        let mut d = DraftKv::new(8, 4);
        let a: Vec<u32> = (1..=6).collect();
        let b: Vec<u32> = vec![9, 9];
        let mut round = d.plan(&[
            DraftWant {
                id: 1,
                tokens: &a,
                k: 3,
            },
            DraftWant {
                id: 2,
                tokens: &b,
                k: 1,
            },
        ]);
        // Pass 0: both catch up from position 0 (6 + 2 tokens); a needs 6 + 2 slots, b 2.
        let inp = d.inputs(&round);
        assert_eq!((inp[0].tokens, inp[0].start_pos), (&a[..], 0));
        assert_eq!((inp[1].tokens, inp[1].start_pos), (&b[..], 0));
        assert_eq!(
            (inp[0].block_tables[0].len(), inp[1].block_tables[0].len()),
            (2, 1)
        );
        assert!(d.absorb(&mut round, &logits(2, 16, |r| 10 + r), argmax));
        // Pass 1: only a, feeding its first draft at position 6.
        let inp = d.inputs(&round);
        assert_eq!(inp.len(), 1);
        assert_eq!((inp[0].tokens, inp[0].start_pos), (&[10][..], 6));
        assert!(d.absorb(&mut round, &logits(1, 16, |_| 12), argmax));
        assert_eq!(d.inputs(&round)[0].start_pos, 7);
        assert!(!d.absorb(&mut round, &logits(1, 16, |_| 13), argmax));
        assert!(round.is_done());
        let drafts = round.drafts();
        let tokens: Vec<Vec<u32>> = drafts
            .iter()
            .map(|(_, ds)| ds.iter().map(|t| t.token).collect())
            .collect();
        assert_eq!(tokens, vec![vec![10, 12, 13], vec![11]]);
        // a: one draft accepted → 6 + 1 valid tokens (of 8 written); b: none → 2.
        d.rollback(1, 7);
        d.rollback(2, 2);
        assert_eq!(d.blocks_in_use(), 2 + 1);
        // The next round catches a up from 7, b from 2 (capped at its last committed token).
        let a2: Vec<u32> = (1..=8).collect();
        let round = d.plan(&[
            DraftWant {
                id: 1,
                tokens: &a2,
                k: 2,
            },
            DraftWant {
                id: 2,
                tokens: &b,
                k: 1,
            },
        ]);
        let inp = d.inputs(&round);
        assert_eq!((inp[0].tokens, inp[0].start_pos), (&a2[7..], 7));
        assert_eq!((inp[1].tokens, inp[1].start_pos), (&b[1..], 1));
        d.abandon(round);
        assert_eq!(d.blocks_in_use(), 0);
    }

    #[test]
    fn idle_caches_are_evicted_before_a_drafting_sequence_is_left_out() {
        let mut d = DraftKv::new(4, 4);
        let long: Vec<u32> = vec![1; 12];
        let round = d.plan(&[DraftWant {
            id: 1,
            tokens: &long,
            k: 1,
        }]);
        assert_eq!(d.blocks_in_use(), 3);
        let _ = round.drafts();
        // 2 needs 2 blocks, 1 free: 1's idle cache is dropped.
        let round = d.plan(&[DraftWant {
            id: 2,
            tokens: &[5, 6, 7, 8, 9],
            k: 2,
        }]);
        assert_eq!(round.jobs.len(), 1);
        assert_eq!(d.blocks_in_use(), 2);
        // Two drafting sequences that cannot both fit: the second is left out.
        let round = d.plan(&[
            DraftWant {
                id: 2,
                tokens: &[5, 6, 7, 8, 9],
                k: 2,
            },
            DraftWant {
                id: 3,
                tokens: &long,
                k: 2,
            },
        ]);
        assert_eq!(round.drafts().len(), 1);
    }
}
