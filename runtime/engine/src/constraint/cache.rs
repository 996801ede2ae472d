//! A bounded least-recently-used map from a constraint's key to its compiled grammar.
//!
//! Invariants: never more than `capacity` entries; a hit makes its entry the most recent; inserting
//! into a full cache evicts the least recent entry. Requests hold their grammar through an `Arc`, so
//! eviction never touches a request in flight. O(1) lookups; an eviction scans the entries (the cache
//! is small: hundreds of grammars).

use std::collections::HashMap;

/// The cache.
pub(crate) struct Lru<V> {
    capacity: usize,
    /// Key → (last use, value).
    entries: HashMap<String, (u64, V)>,
    /// The use counter.
    clock: u64,
}

impl<V: Clone> Lru<V> {
    /// An empty cache of at most `capacity` entries (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            clock: 0,
        }
    }

    /// The value for `key`, now the most recent.
    pub(crate) fn get(&mut self, key: &str) -> Option<V> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(key).map(|(used, v)| {
            *used = clock;
            v.clone()
        })
    }

    /// Inserts (or replaces) `key`, evicting the least recent entry when full.
    pub(crate) fn insert(&mut self, key: String, value: V) {
        self.clock += 1;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.entries.remove(&k);
            }
        }
        self.entries.insert(key, (self.clock, value));
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = Lru::new(2);
        c.insert("a".into(), 1);
        c.insert("b".into(), 2);
        assert_eq!(c.get("a"), Some(1), "a is now the most recent");
        c.insert("c".into(), 3);
        assert_eq!((c.get("b"), c.get("a"), c.get("c")), (None, Some(1), Some(3)));
        c.insert("a".into(), 4);
        assert_eq!((c.len(), c.get("a")), (2, Some(4)), "replacing does not evict");
        c.insert("d".into(), 5);
        assert_eq!((c.get("c"), c.get("a"), c.len()), (None, Some(4), 2));
    }
}
