//! The CPU backend: [`CpuKernels`] implements [`crate::Kernels`] on `Vec<f32>` buffers with its own
//! thread pool (`pool.rs`, `--threads` threads, the caller included: several pods may share a node, so
//! the pool is never a global one).
//!
//! Invariants: the instruction set is chosen once at construction and never per call, so results are
//! reproducible within a process; all kernels are batch-invariant (see [`simd`]).

mod attention;
mod bfpanels;
mod elementwise;
mod encoder;
mod kv_q8;
mod matmul;
mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_avx512;
mod pool;
mod qdot;
#[cfg(target_arch = "x86_64")]
mod qdot_avx512;
mod qpanels;
pub mod simd;
#[cfg(test)]
mod test_data;

pub use bfpanels::{Bf16Dot, BfPanels, supported as bf16_dot_supported};
pub use elementwise::{max_lanes, softmax_in_place};
pub use packed::Packed;
pub use qpanels::{QPanels, held_bytes};
pub use simd::Isa;

use crate::Kernels;
use crate::layout::{AttnHeads, AttnSeq, KvLayout, Rope};
use crate::weight::HostWeight;
use matmul::MatmulShape;

/// A weight as the CPU kernels hold it: float matrices of 16 rows or more repacked into panels for the
/// outer-product matmul ([`Packed`]) or, f16/bf16 ones on CPUs with AVX-512 BF16 (unless switched
/// off: [`Bf16Dot`]), into bf16 pair panels ([`BfPanels`]); quantized matrices into integer panels
/// with AVX-512 VNNI ([`QPanels`]); vectors, and quantized matrices without VNNI, in their stored
/// layout.
#[derive(Debug)]
pub enum CpuWeight {
    /// The stored layout (zero-copy over the model file).
    Host(HostWeight),
    /// Panel layout, owned.
    Packed(Packed),
    /// Integer panel layout (quantized formats), owned.
    QPanels(QPanels),
    /// bf16 pair panels (f16/bf16 matrices), owned.
    BfPanels(BfPanels),
}

impl CpuWeight {
    /// The weight as a host (stored-layout) weight: borrowed when it is one, rebuilt otherwise.
    /// Only vectors (norm weights, biases) are read this way, and those are never packed.
    fn vector(&self) -> std::borrow::Cow<'_, HostWeight> {
        match self {
            CpuWeight::Host(h) => std::borrow::Cow::Borrowed(h),
            CpuWeight::Packed(p) => std::borrow::Cow::Owned(p.to_host()),
            CpuWeight::QPanels(p) => std::borrow::Cow::Owned(p.to_host()),
            CpuWeight::BfPanels(p) => std::borrow::Cow::Owned(p.to_host()),
        }
    }
}

/// The CPU kernels.
pub struct CpuKernels {
    /// Instruction set used by every kernel.
    isa: Isa,
    /// Compute threads; kernels split work over them inside [`Kernels::scope`].
    pool: pool::Pool,
    /// Which float matrices run on bf16 dot products.
    bf16_dot: Bf16Dot,
}

impl CpuKernels {
    /// Kernels with `threads` compute threads (0 = one per core) and the best ISA of this CPU.
    pub fn new(threads: usize) -> Self {
        Self::with_isa(threads, Isa::detect())
    }

    /// Kernels forced to `isa` (tests compare the portable and SIMD paths).
    ///
    /// # Panics
    /// On x86-64, if this CPU lacks an extension `isa` needs (its kernels would be undefined behaviour).
    pub fn with_isa(threads: usize, isa: Isa) -> Self {
        // `Isa`'s invariant, which the SIMD kernels' `unsafe` blocks rely on (off x86-64 every `Isa`
        // runs the portable code).
        #[cfg(target_arch = "x86_64")]
        assert!(isa.is_available(), "{isa:?} is not supported by this CPU");
        Self {
            isa,
            pool: pool::Pool::new(threads),
            bf16_dot: Bf16Dot::from_env(),
        }
    }

    /// These kernels with float matrices uploaded from now on held as `mode` says (the default is
    /// [`Bf16Dot::from_env`]).
    pub fn with_bf16_dot(mut self, mode: Bf16Dot) -> Self {
        self.bf16_dot = mode;
        self
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }
}

impl Kernels for CpuKernels {
    type Buf = Vec<f32>;
    type Weight = CpuWeight;

    fn describe(&self) -> String {
        // Only what takes effect: the bf16 panels need AVX-512 and its BF16 extension.
        let dot = match self.bf16_dot {
            _ if self.isa != Isa::Avx512 || !bfpanels::supported() => "",
            Bf16Dot::Off => "",
            Bf16Dot::Bf16 => " bf16-dot(bf16)",
            Bf16Dot::All => " bf16-dot(f16, bf16)",
        };
        format!("cpu {:?} x{} threads{dot}", self.isa, self.pool.threads())
    }

    fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.scope(f)
    }

    fn upload(&self, w: &HostWeight) -> CpuWeight {
        if self.isa == Isa::Avx512
            && let Some(p) = self.pool.scope(|| QPanels::pack(w))
        {
            return CpuWeight::QPanels(p);
        }
        if self.isa == Isa::Avx512
            && self.bf16_dot.covers(w.dtype())
            && let Some(p) = self.pool.scope(|| BfPanels::pack(w))
        {
            return CpuWeight::BfPanels(p);
        }
        match self.pool.scope(|| Packed::pack(w)) {
            Some(p) => CpuWeight::Packed(p),
            // Vectors (norms, biases) are copied, so a model whose matrices were all packed does not keep
            // its memory-mapped file alive; quantized matrices stay zero-copy on the map.
            None if w.rows() < packed::NR => CpuWeight::Host(w.to_owned_copy()),
            None => CpuWeight::Host(w.clone()),
        }
    }

    fn alloc(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    fn read(&self, src: &Vec<f32>, dst: &mut [f32]) {
        dst.copy_from_slice(&src[..dst.len()]);
    }

    fn embedding(&self, table: &CpuWeight, ids: &[u32], out: &mut Vec<f32>) {
        match table {
            CpuWeight::Host(t) => elementwise::embedding(t.data(), t.cols(), ids, out),
            CpuWeight::Packed(t) => {
                let dim = t.cols();
                for (r, &id) in ids.iter().enumerate() {
                    t.row_to_f32(id as usize, &mut out[r * dim..(r + 1) * dim]);
                }
            }
            CpuWeight::QPanels(t) => {
                let dim = t.cols();
                for (r, &id) in ids.iter().enumerate() {
                    t.row_to_f32(id as usize, &mut out[r * dim..(r + 1) * dim]);
                }
            }
            CpuWeight::BfPanels(t) => {
                let dim = t.cols();
                for (r, &id) in ids.iter().enumerate() {
                    t.row_to_f32(id as usize, &mut out[r * dim..(r + 1) * dim]);
                }
            }
        }
    }

    fn matmul(&self, x: &Vec<f32>, rows: usize, w: &CpuWeight, bias: Option<&CpuWeight>, out: &mut Vec<f32>) {
        let bias = bias.map(CpuWeight::vector);
        let bias = bias.as_ref().map(|b| b.data());
        match w {
            CpuWeight::Packed(p) => packed::matmul(self.isa, x, rows, p, bias, out),
            CpuWeight::QPanels(p) => qpanels::matmul(x, rows, p, bias, out),
            CpuWeight::BfPanels(p) => bfpanels::matmul(x, rows, p, bias, out),
            CpuWeight::Host(w) => {
                let shape = MatmulShape {
                    rows,
                    k: w.cols(),
                    n: w.rows(),
                };
                matmul::matmul(self.isa, x, w.data(), bias, shape, out);
            }
        }
    }

    fn rms_norm(&self, x: &Vec<f32>, rows: usize, weight: &CpuWeight, eps: f32, out: &mut Vec<f32>) {
        elementwise::rms_norm(x, weight.vector().data(), eps, out, rows);
    }

    fn add_assign(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        x[..len].iter_mut().zip(&y[..len]).for_each(|(a, b)| *a += b);
    }

    fn silu_mul(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>, len: usize) {
        elementwise::silu_mul(self.isa, &gate[..len], &up[..len], &mut out[..len]);
    }

    fn gelu_mul(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>, len: usize) {
        elementwise::gelu_mul(self.isa, &gate[..len], &up[..len], &mut out[..len]);
    }

    fn scale(&self, x: &mut Vec<f32>, len: usize, factor: f32) {
        x[..len].iter_mut().for_each(|v| *v *= factor);
    }

    fn rope(&self, x: &mut Vec<f32>, num_heads: usize, head_dim: usize, positions: &[u32], rope: Rope<'_>) {
        elementwise::rope(x, num_heads, head_dim, positions, rope);
    }

    fn write_kv(
        &self,
        k: &Vec<f32>,
        v: &Vec<f32>,
        slots: &[u32],
        layout: &KvLayout,
        k_cache: &mut Vec<f32>,
        v_cache: &mut Vec<f32>,
    ) {
        elementwise::write_kv(k, v, slots, layout, k_cache, v_cache);
    }

    fn paged_attention(
        &self,
        q: &Vec<f32>,
        seqs: &[AttnSeq<'_>],
        heads: AttnHeads,
        layout: &KvLayout,
        caches: (&Vec<f32>, &Vec<f32>),
        out: &mut Vec<f32>,
    ) {
        attention::paged_attention(self.isa, q, seqs, heads, layout, (caches.0, caches.1), out);
    }

    fn layer_norm(
        &self,
        x: &Vec<f32>,
        rows: usize,
        weight: &CpuWeight,
        bias: &CpuWeight,
        eps: f32,
        out: &mut Vec<f32>,
    ) {
        encoder::layer_norm(x, weight.vector().data(), bias.vector().data(), eps, out, rows);
    }

    fn gelu(&self, x: &mut Vec<f32>, len: usize) {
        encoder::gelu_erf(self.isa, &mut x[..len]);
    }

    fn encoder_attention(
        &self,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        seqs: &[(usize, usize)],
        heads: AttnHeads,
        out: &mut Vec<f32>,
    ) {
        encoder::bidirectional_attention(self.isa, q, k, v, seqs, heads, out);
    }

    fn gather_rows(&self, x: &Vec<f32>, width: usize, rows: &[usize], out: &mut Vec<f32>) {
        for (i, &r) in rows.iter().enumerate() {
            out[i * width..(i + 1) * width].copy_from_slice(&x[r * width..(r + 1) * width]);
        }
    }

    fn zero(&self, x: &mut Vec<f32>, len: usize) {
        x[..len].fill(0.0);
    }

    fn scatter_add_weighted(
        &self,
        src: &Vec<f32>,
        width: usize,
        rows: &[usize],
        weights: &[f32],
        out: &mut Vec<f32>,
    ) {
        for ((i, &r), &w) in rows.iter().enumerate().zip(weights) {
            let s = &src[i * width..(i + 1) * width];
            out[r * width..(r + 1) * width]
                .iter_mut()
                .zip(s)
                .for_each(|(o, v)| *o += w * v);
        }
    }

    fn scatter_add_scaled(
        &self,
        src: &Vec<f32>,
        width: usize,
        rows: &[usize],
        scale: f32,
        out: &mut Vec<f32>,
    ) {
        for (i, &r) in rows.iter().enumerate() {
            let s = &src[i * width..(i + 1) * width];
            out[r * width..(r + 1) * width]
                .iter_mut()
                .zip(s)
                .for_each(|(o, v)| *o += scale * v);
        }
    }
}
