//! The KV-cache storage: per layer, one K and one V buffer in the paged layout of
//! [`modelfleet_kernels::KvLayout`], owned by the backend (host memory on CPU, device memory later).
//!
//! Invariants: storage is allocated once, at start-up, for a fixed number of blocks; only the forward
//! pass writes it, at the slots its batch's block tables name.

use modelfleet_kernels::{Kernels, KvLayout};

/// K and V storage for every layer.
pub struct KvCache<K: Kernels> {
    /// Shape of each layer's K (and V) buffer.
    pub layout: KvLayout,
    /// Keys, one buffer per layer.
    pub k: Vec<K::Buf>,
    /// Values, one buffer per layer.
    pub v: Vec<K::Buf>,
}

impl<K: Kernels> KvCache<K> {
    /// Zeroed storage for `num_layers` layers.
    pub fn new(kernels: &K, num_layers: usize, layout: KvLayout) -> Self {
        Self {
            layout,
            k: (0..num_layers)
                .map(|_| kernels.alloc(layout.storage_words()))
                .collect(),
            v: (0..num_layers)
                .map(|_| kernels.alloc(layout.storage_words()))
                .collect(),
        }
    }

    /// Bytes of storage (K and V over all layers, in the layout's element type).
    pub fn bytes(&self) -> usize {
        2 * self.k.len() * self.layout.bytes()
    }
}
