//! Plain-data descriptions the kernels share with the engine: the paged KV-cache layout and the ragged
//! batch as attention sees it.
//!
//! Invariants: a KV cache of one layer is `num_blocks × num_kv_heads × block_size × head_dim` f32,
//! indexed block-major so one head's entries of one block are contiguous (vLLM's paged layout, with
//! heads outside slots). Values are stored slot by slot (`[block][head][slot][dim]`, [`KvLayout::offset`]);
//! keys are transposed within the block (`[block][head][dim][slot]`, [`KvLayout::key_offset`]), so one
//! dimension of consecutive keys is contiguous and attention scores a register's width of keys at once. A token at position `p` of a sequence lives in block `block_table[p / block_size]`,
//! slot `p % block_size`; its "slot id" is `block * block_size + slot` (vLLM's `slot_mapping`). Elements
//! are f32, f16 or 8-bit ([`KvDType`]); an f16 cache lives in a backend f32 buffer of half the words. An
//! 8-bit (`Q8_0`) cache holds its `i8` elements in that layout, followed in the same buffer by one f16
//! scale per (block, head, slot) — per cached head vector — at [`KvLayout::scale_offset`].

/// The shape of one layer's paged K (or V) cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Key/value heads (fewer than query heads under grouped-query attention).
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// How each element is stored.
    pub dtype: KvDType,
}

/// The element type of the KV cache (vLLM's `--kv-cache-dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDType {
    /// 32-bit floats: exactly what the model computed.
    #[default]
    F32,
    /// IEEE half precision, rounded to nearest when written (llama.cpp's default cache type): half the
    /// memory and half the bytes attention reads; attention still computes in f32.
    F16,
    /// 8-bit integers with one f16 scale per head vector (a token's `head_dim` keys or values of one KV
    /// head: symmetric, `scale = max|x| / 127`, `x ≈ q · scale`): 1 + 2/`head_dim` bytes per element,
    /// so 1.94× the tokens of f16 at `head_dim` 64 and 1.97× at 128 (llama.cpp's `q8_0` keeps a scale
    /// per 32 elements: 1.88×). Attention widens the integers in registers and applies the key scale to
    /// the score and the value scale to the probability, never to the cached elements.
    Q8_0,
}

impl KvDType {
    /// Bytes of one cached head vector of `head_dim` elements (its scale included).
    pub fn vector_bytes(self, head_dim: usize) -> usize {
        match self {
            KvDType::F32 => 4 * head_dim,
            KvDType::F16 => 2 * head_dim,
            KvDType::Q8_0 => head_dim + 2,
        }
    }

    /// The name `--kv-cache-dtype` and the metrics use (`float32`, `float16`, `q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvDType::F32 => "float32",
            KvDType::F16 => "float16",
            KvDType::Q8_0 => "q8_0",
        }
    }
}

impl KvLayout {
    /// Elements in one layer's K (or V) cache.
    pub fn len(&self) -> usize {
        self.num_blocks * self.num_kv_heads * self.block_size * self.head_dim
    }

    /// Cached head vectors (tokens × KV heads) in one layer's K (or V) cache: the scales of an 8-bit one.
    pub fn num_vectors(&self) -> usize {
        self.num_blocks * self.num_kv_heads * self.block_size
    }

    /// Bytes of one layer's K (or V) cache (an 8-bit one's scales included).
    pub fn bytes(&self) -> usize {
        self.num_vectors() * self.dtype.vector_bytes(self.head_dim)
    }

    /// f32 words of backend buffer that hold one layer's K (or V) cache (two f16 elements per word; an
    /// 8-bit one's `len()` bytes and then its scales).
    pub fn storage_words(&self) -> usize {
        self.bytes().div_ceil(4)
    }

    /// Index of the scale of the vector in `(block, head, slot)` among an 8-bit cache's scales: the
    /// scales of one head's consecutive slots are contiguous, as its transposed keys are.
    #[inline]
    pub fn scale_offset(&self, block: usize, head: usize, slot: usize) -> usize {
        (block * self.num_kv_heads + head) * self.block_size + slot
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element offset of dimension 0 of the key in `(block, head, slot)`; dimension `d` is
    /// `block_size · d` further on.
    #[inline]
    pub fn key_offset(&self, block: usize, head: usize, slot: usize) -> usize {
        (block * self.num_kv_heads + head) * self.block_size * self.head_dim + slot
    }

    /// Element offset of the value in `(block, head, slot)` (its `head_dim` elements are contiguous).
    #[inline]
    pub fn offset(&self, block: usize, head: usize, slot: usize) -> usize {
        ((block * self.num_kv_heads + head) * self.block_size + slot) * self.head_dim
    }

    /// The slot id of position `pos` of a sequence with `block_table`.
    pub fn slot_id(&self, block_table: &[u32], pos: usize) -> u32 {
        block_table[pos / self.block_size] * self.block_size as u32 + (pos % self.block_size) as u32
    }
}

/// One sequence's rows in a ragged batch, as attention needs them.
#[derive(Clone, Copy, Debug)]
pub struct AttnSeq<'a> {
    /// Index of the sequence's first new row in the batch.
    pub row_start: usize,
    /// New rows (tokens) this step: a prefill chunk or one decode token.
    pub num_rows: usize,
    /// Position of the first new token (tokens before it are already in the cache).
    pub first_pos: usize,
    /// Blocks holding positions `0..first_pos + num_rows`; under a sliding window, entries before the
    /// block holding the first row's window start are never read and may be any value.
    pub block_table: &'a [u32],
}

/// Head configuration of an attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnHeads {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads; `num_heads` is a multiple of it.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Score scale, normally `1/sqrt(head_dim)`.
    pub scale: f32,
    /// Sliding window: the query at position `p` sees positions `p + 1 − window ..= p` only (Mistral,
    /// Gemma's local layers); `None` sees the whole context.
    pub window: Option<usize>,
}

/// Rotary-embedding parameters.
#[derive(Clone, Copy, Debug)]
pub struct Rope<'a> {
    /// Per-pair inverse frequencies, scaling already applied: `head_dim / 2` of them, or fewer when
    /// only the first `2 · inv_freq.len()` elements of each head rotate (Phi-3's partial rotary
    /// dimensions); the rest pass through unchanged.
    pub inv_freq: &'a [f32],
    /// Pairs are adjacent elements `(2i, 2i+1)` (GGML's "normal" mode, which GGUF Llama files need
    /// because their converter permuted Q/K rows) instead of Hugging Face's rotate-half `(i, i + d/2)`.
    pub interleaved: bool,
    /// Cosines and sines are multiplied by this (LongRoPE's attention factor); 1 otherwise. It scales
    /// the rotated elements only.
    pub scale: f32,
}
