//! The O(1) free list of the prefix-caching pool, in LRU order (vLLM v1's `FreeKVCacheBlockQueue`): a
//! doubly linked list threaded through two `Vec`s indexed by block id, so push, pop and removal from the
//! middle are O(1) and allocate nothing after construction.
//!
//! Invariants: a block is in the list at most once; `len()` counts the blocks in it; the head is the
//! least recently freed block (next to be reused), the tail the most recent.

use super::block_pool::BlockId;

/// "No block": the end of the list.
const NIL: BlockId = BlockId::MAX;

#[derive(Debug)]
pub(crate) struct FreeQueue {
    /// `prev[b]`: the block before `b` (towards the head), or `NIL`.
    prev: Vec<BlockId>,
    /// `next[b]`: the block after `b` (towards the tail), or `NIL`.
    next: Vec<BlockId>,
    /// `linked[b]`: whether `b` is in the list; guards against double insertion or removal.
    linked: Vec<bool>,
    /// Least recently freed block, or `NIL` when empty.
    head: BlockId,
    /// Most recently freed block, or `NIL` when empty.
    tail: BlockId,
    /// Blocks in the list.
    len: usize,
}

impl FreeQueue {
    /// A queue holding every block `0..n` in id order (so a fresh pool hands out 0, 1, 2, …).
    pub(crate) fn full(n: usize) -> Self {
        assert!(n < NIL as usize, "too many blocks for a u32 id");
        let mut q = Self {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            linked: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
        };
        for b in 0..n as BlockId {
            q.push_back(b);
        }
        q
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, b: BlockId) -> bool {
        self.linked[b as usize]
    }

    /// Appends `b` at the most recently used end.
    pub(crate) fn push_back(&mut self, b: BlockId) {
        assert!(!self.linked[b as usize], "block {b} is already free");
        let i = b as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.linked[i] = true;
        self.len += 1;
    }

    /// Takes the least recently used block.
    pub(crate) fn pop_front(&mut self) -> Option<BlockId> {
        if self.head == NIL {
            return None;
        }
        let b = self.head;
        self.remove(b);
        Some(b)
    }

    /// Unlinks `b` from wherever it is in the list.
    pub(crate) fn remove(&mut self, b: BlockId) {
        let i = b as usize;
        assert!(self.linked[i], "block {b} is not free");
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.linked[i] = false;
        self.len -= 1;
    }

    /// The blocks from head (LRU) to tail (MRU), walking both directions and checking the links agree.
    #[cfg(test)]
    pub(crate) fn to_vec_checked(&self) -> Vec<BlockId> {
        let mut fwd = Vec::new();
        let mut b = self.head;
        let mut last = NIL;
        while b != NIL {
            assert_eq!(self.prev[b as usize], last, "prev link of {b}");
            assert!(self.linked[b as usize]);
            fwd.push(b);
            assert!(fwd.len() <= self.linked.len(), "cycle in free list");
            last = b;
            b = self.next[b as usize];
        }
        assert_eq!(last, self.tail);
        assert_eq!(fwd.len(), self.len);
        assert_eq!(self.linked.iter().filter(|&&l| l).count(), self.len);
        fwd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_and_remove_from_the_middle_keep_lru_order() {
        let mut q = FreeQueue::full(4);
        assert_eq!(q.to_vec_checked(), vec![0, 1, 2, 3]);
        q.remove(2);
        q.remove(0);
        assert_eq!(q.to_vec_checked(), vec![1, 3]);
        q.push_back(0);
        assert_eq!(q.pop_front(), Some(1));
        q.remove(0);
        assert_eq!(q.to_vec_checked(), vec![3]);
        assert_eq!(q.pop_front(), Some(3));
        assert_eq!(q.pop_front(), None);
        assert_eq!(q.len(), 0);
        q.push_back(2);
        assert!(q.contains(2) && !q.contains(3));
        assert_eq!(q.to_vec_checked(), vec![2]);
    }
}
