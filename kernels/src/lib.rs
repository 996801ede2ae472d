//! Compute kernels for the runtime engine behind one small trait, [`Kernels`], so the portable CPU
//! backend ([`cpu::CpuKernels`], the default, tested everywhere) and a CUDA backend (a later issue:
//! `.cu` sources compiled at run time through NVRTC with `cudarc`, behind a `cuda` feature) are
//! interchangeable under the engine's forward pass.
//!
//! Tour:
//! - [`weight`]: weights in their stored dtype (f32/f16/bf16), zero-copy over memory-mapped files.
//! - [`layout`]: the paged KV-cache layout and the ragged-batch description attention reads.
//! - [`cpu`]: the CPU backend — float matrices repacked at upload into 16-row panels for an
//!   outer-product (BLIS-style) matmul with AVX2 and AVX-512 tiles, integer dot products for
//!   Q8_0/Q4_0/Q4_1, paged attention with an online softmax, RMSNorm, RoPE, SwiGLU, all
//!   multi-threaded on the backend's own fork-join pool (`cpu::pool`).
//!
//! Architecture invariants:
//! - Activations are f32; weights stay in their stored dtype (float matrices may be reordered into
//!   panels at upload) and are widened as they are read — except Q8_0/Q4_0/Q4_1 products on AVX2 and
//!   AVX-512, which quantize each activation row to 8-bit blocks and take integer dot products, as ggml
//!   does (`cpu::qdot`, `cpu::qdot_avx512`).
//! - Batch invariance: every reduction for one output element runs in an order fixed by that element's
//!   own inputs, never by the batch size or thread count, so a sequence's logits are bit-identical
//!   alone or in any batch.
//! - The kernels do no I/O and own no model logic; the engine composes them.

// The SIMD kernels are mostly `unsafe`: every block must say why it is sound (`// SAFETY:`).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cpu;
pub mod layout;
pub mod quant;
pub mod weight;

pub use layout::{AttnHeads, AttnSeq, KvDType, KvLayout, Rope};
pub use quant::QuantKind;
pub use weight::{ByteSource, DType, HostWeight, WeightData, WeightError};

/// The operations the decoder's forward pass needs, on backend-owned buffers.
///
/// Buffers are f32 and sized by the caller; shapes are passed explicitly (row-major `rows × width`).
/// Indices and metadata (`ids`, `positions`, block tables) are host slices: a device backend copies them
/// per call. Implementations must be batch-invariant (see the crate header).
pub trait Kernels: Send + Sync {
    /// An f32 activation or cache buffer.
    type Buf: Send + Sync;
    /// A weight resident where the kernels run.
    type Weight: Send + Sync;

    /// A short description, e.g. `"cpu avx2 x2 threads"`.
    fn describe(&self) -> String;
    /// Runs `f` with the backend's execution resources (the CPU backend's thread pool).
    fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R;
    /// Makes a host weight available to the kernels.
    fn upload(&self, w: &HostWeight) -> Self::Weight;
    /// A zeroed buffer of `len` elements.
    fn alloc(&self, len: usize) -> Self::Buf;
    /// Copies the first `dst.len()` elements of `src` to the host.
    fn read(&self, src: &Self::Buf, dst: &mut [f32]);
    /// `out[r] = table[ids[r]]` (rows of the embedding matrix, widened to f32).
    fn embedding(&self, table: &Self::Weight, ids: &[u32], out: &mut Self::Buf);
    /// `out = x · wᵀ + bias`, `x` being `rows × w.cols`, `out` `rows × w.rows`.
    fn matmul(
        &self,
        x: &Self::Buf,
        rows: usize,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        out: &mut Self::Buf,
    );
    /// Row-wise RMSNorm of `x` (`rows × weight.len`) scaled by `weight`, into `out`.
    fn rms_norm(&self, x: &Self::Buf, rows: usize, weight: &Self::Weight, eps: f32, out: &mut Self::Buf);
    /// `x[..len] += y[..len]`.
    fn add_assign(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize);
    /// `out = silu(gate) * up` over `len` elements (SwiGLU).
    fn silu_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf, len: usize);
    /// `out = gelu_tanh(gate) * up` over `len` elements (GeGLU, the tanh approximation of GELU).
    fn gelu_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf, len: usize);
    /// `x[..len] *= factor`.
    fn scale(&self, x: &mut Self::Buf, len: usize, factor: f32);
    /// Rotary embedding in place on `rows × num_heads × head_dim`, row `r` at `positions[r]`.
    fn rope(&self, x: &mut Self::Buf, num_heads: usize, head_dim: usize, positions: &[u32], rope: Rope<'_>);
    /// Stores row `r` of `k`/`v` (`rows × num_kv_heads × head_dim`) at slot id `slots[r]`.
    fn write_kv(
        &self,
        k: &Self::Buf,
        v: &Self::Buf,
        slots: &[u32],
        layout: &KvLayout,
        k_cache: &mut Self::Buf,
        v_cache: &mut Self::Buf,
    );
    /// Causal attention of the new rows of every sequence over that sequence's cached keys and values
    /// (which already include the new rows), read straight from the paged blocks.
    fn paged_attention(
        &self,
        q: &Self::Buf,
        seqs: &[AttnSeq<'_>],
        heads: AttnHeads,
        layout: &KvLayout,
        caches: (&Self::Buf, &Self::Buf),
        out: &mut Self::Buf,
    );
    /// Row-wise LayerNorm of `x` (`rows × weight.len`): `(x − mean) / sqrt(var + eps) · weight + bias`.
    fn layer_norm(
        &self,
        x: &Self::Buf,
        rows: usize,
        weight: &Self::Weight,
        bias: &Self::Weight,
        eps: f32,
        out: &mut Self::Buf,
    );
    /// `x[..len] = gelu(x)`, the exact (erf) GELU of BERT-family encoders.
    fn gelu(&self, x: &mut Self::Buf, len: usize);
    /// Bidirectional attention of an encoder: each row of a sequence `(first row, rows)` of `seqs`
    /// attends to every row of that sequence (no mask, no cache). `q`/`out` are `rows × num_heads ×
    /// head_dim`, `k`/`v` `rows × num_kv_heads × head_dim`; `heads.window` is not used.
    fn encoder_attention(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        seqs: &[(usize, usize)],
        heads: AttnHeads,
        out: &mut Self::Buf,
    );
    /// `out[i] = x[rows[i]]` for rows of `width` elements.
    fn gather_rows(&self, x: &Self::Buf, width: usize, rows: &[usize], out: &mut Self::Buf);
    /// `x[..len] = 0`.
    fn zero(&self, x: &mut Self::Buf, len: usize);
    /// `out[rows[i]] += weights[i] · src[i]` for rows of `width` elements (an expert's output added to
    /// the rows routed to it, each with its router weight; `rows` holds no duplicates).
    fn scatter_add_weighted(
        &self,
        src: &Self::Buf,
        width: usize,
        rows: &[usize],
        weights: &[f32],
        out: &mut Self::Buf,
    );
    /// `out[rows[i]] += scale · src[i]` for rows of `width` elements (a LoRA delta added back to the
    /// rows of its group; `rows` holds no duplicates).
    fn scatter_add_scaled(
        &self,
        src: &Self::Buf,
        width: usize,
        rows: &[usize],
        scale: f32,
        out: &mut Self::Buf,
    );
}
