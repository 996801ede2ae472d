//! Quantized weight matrices (every format: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K) repacked into
//! panels of 16 rows for an outer-product integer matmul on AVX-512 VNNI: every weight byte decoded
//! feeds up to 6 activation rows (a speculative verification step of up to 6 rows reads and decodes
//! the weights once, as a decode step does), and each output's block
//! sum is finished in its own 32-bit lane (no horizontal reduction: one conversion and one FMA per
//! block for 16 outputs), where the row-layout tiles (`qdot_avx512`) spend a conversion and an FMA
//! per pair of blocks for every single output.
//!
//! Layout: the `n × k` matrix is cut into panels of [`NR`] consecutive rows (the last one padded with
//! zero rows). The products run in units of 32 columns (one activation block); a panel holds its
//! units in chunks ([`Format::UNITS`] units, [`Format::CHUNK`] bytes, a whole number of cache lines).
//! Values are unsigned (`vpdpbusd` multiplies unsigned bytes by signed ones; the activations are the
//! signed side, broadcast 4 bytes at a time) and read in groups of 64 bytes: group `g` of a unit
//! holds its values `4g..4g+4` of the 16 rows, row after row.
//! - Q8_0, a chunk of two blocks (1088 bytes): the 16 rows' f16 scales of the even block (32 bytes),
//!   those of the odd block, then each block's 8 groups, each value stored as `q + 128` (a flip of the
//!   top bit).
//! - Q4_0, Q4_1, Q5_0, Q5_1, two blocks (576, 640, 704, 768 bytes): the two blocks' scales as for
//!   Q8_0, (Q4_1, Q5_1) their minimums likewise, then per block the nibbles as 4 vectors of 64 bytes
//!   (lane `j` holds bytes `4v..4v+4` of row `j`'s 16 nibble bytes: low nibbles are group `v`, high
//!   nibbles group `v + 4`, as in the file) and (Q5) one vector of fifth bits (lane `j`'s bit `8i + g`
//!   is value `4g + i`'s fifth bit), so group `g` is an `and`, a shift and an `or` away. Values are
//!   `q + 8` (Q4_0), `q + 16` (Q5_0) or `q` (Q4_1, Q5_1).
//! - Q4_K, one super-block of 8 units (2368 bytes): the rows' f16 `d` and `dmin` (32 bytes each),
//!   each unit's 6-bit scales (16 bytes, one per row) and minimums (16 bytes), then 4 unit pairs of
//!   8 vectors (lane `j` holds bytes `4v..4v+4` of row `j`'s 32 bytes of the pair: low nibbles are
//!   the even unit's group `v`, high nibbles the odd unit's). Values are `q ∈ 0..16`.
//! - Q6_K, one super-block of 8 units (4416 bytes): the rows' f16 `d` (32 bytes, 32 of padding), each
//!   unit's two 8-bit sub-block scales (16 bytes each: values 0–15, then 16–31), then each unit's 8
//!   groups, each 6-bit value widened to a byte (`q + 32 ∈ 0..64`): 31% more than the file's bytes,
//!   where the other formats keep the file's size, so a group is one load.
//!
//! Arithmetic: for activation row `r` and weight row `j`, per unit `u`:
//! `S = Σ x_q · v − OFFSET · Σ x_q` with `v` the stored unsigned values (`OFFSET` 128, 32, 16, 8 or
//! 0) — exact in 32 bits; the accumulator starts at `−OFFSET · Σ x_q` — then `acc += f32(S) · (d_w ·
//! d_x)` (one FMA; Q4_K's `d_w` is `d · sc`, computed in f32, exact), and for the formats with
//! minimums `acc += m · s_x` (Q4_K: `acc −= (dmin · m) · s_x`; `s_x = d_x · Σ x_q` rounded to f16, as
//! ggml's `block_q8_1` and the row tiles hold it); units in order; the bias (0 without one) last. Q6_K's two sub-blocks of 16 each
//! take their own sum (`OFFSET` applied to each half's `Σ x_q`) and FMA with `d · sc`.
//! Invariants: each output is that chain, whatever the tile (1–6 rows, 1–4 panels), the batch or the
//! thread count, so a row's outputs are bit-identical alone or in any batch. It differs from the
//! row-layout tiles in rounding order only (those fuse two blocks' lanes into one 16-lane sum).
//!
//! Used when the CPU has AVX-512 VNNI (`Isa::Avx512`); the AVX2 path keeps the stored layout. The
//! packed copy is owned; it has the file's size (the same bytes, rearranged) but for Q6_K (above).

use super::matmul::OutPtr;
use super::packed::Line;
use super::pool;
use crate::quant::QuantKind;
use crate::weight::{DType, HostWeight, WeightData};

/// Weight rows per panel (one 16-lane register).
pub(crate) const NR: usize = 16;

/// How one block format is stored in panels.
pub(crate) trait Format {
    /// Bytes of one block in the file.
    const BLOCK: usize;
    /// Units of 32 values in one block of the file.
    const BLOCK_UNITS: usize;
    /// Units in one chunk of a panel.
    const UNITS: usize;
    /// Bytes of one chunk (16 rows).
    const CHUNK: usize;
    /// What the stored unsigned values exceed the signed ones by.
    const OFFSET: i32;
    /// Row `j`'s block `src` (file layout), the `b`-th block of the row, into its chunk.
    fn pack(src: &[u8], b: usize, j: usize, chunk: &mut [u8]);
    /// The inverse of [`Format::pack`].
    fn unpack(chunk: &[u8], b: usize, j: usize, dst: &mut [u8]);
}

/// Q8_0: an f16 scale and 32 signed bytes.
pub(crate) struct Q8;
/// The 32-value nibble formats: an f16 scale, (`MIN`) an f16 minimum, (`FIFTH`) 32 fifth bits, 16
/// bytes of nibbles. Q4_0 `d · (q − 8)`, Q4_1 `d · q + m`, Q5_0 `d · (q − 16)`, Q5_1 `d · q + m`.
pub(crate) struct Nib<const MIN: bool, const FIFTH: bool>;
pub(crate) type Q4_0 = Nib<false, false>;
pub(crate) type Q4_1 = Nib<true, false>;
pub(crate) type Q5 = Nib<false, true>;
pub(crate) type Q5_1 = Nib<true, true>;
/// Q4_K: f16 `d` and `dmin`, 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles.
pub(crate) struct Q4k;

/// Q8_0 and Q5_0 chunks: two blocks' f16 scales (32 bytes each), then each block's values.
const fn two_blocks(values: usize) -> usize {
    64 + 2 * values
}

impl Format for Q8 {
    const BLOCK: usize = 34;
    const BLOCK_UNITS: usize = 1;
    const UNITS: usize = 2;
    const CHUNK: usize = two_blocks(8 * 64);
    const OFFSET: i32 = 128;
    fn pack(src: &[u8], b: usize, j: usize, chunk: &mut [u8]) {
        chunk[(b % 2) * 32 + 2 * j..][..2].copy_from_slice(&src[..2]);
        let values = &mut chunk[64 + (b % 2) * 512..];
        for g in 0..8 {
            for i in 0..4 {
                values[g * 64 + 4 * j + i] = src[2 + 4 * g + i] ^ 0x80;
            }
        }
    }
    fn unpack(chunk: &[u8], b: usize, j: usize, dst: &mut [u8]) {
        dst[..2].copy_from_slice(&chunk[(b % 2) * 32 + 2 * j..][..2]);
        let values = &chunk[64 + (b % 2) * 512..];
        for g in 0..8 {
            for i in 0..4 {
                dst[2 + 4 * g + i] = values[g * 64 + 4 * j + i] ^ 0x80;
            }
        }
    }
}

impl<const MIN: bool, const FIFTH: bool> Nib<MIN, FIFTH> {
    /// Bytes of one block's values in a chunk: 4 nibble vectors, and the fifth bits' vector.
    const VALUES: usize = 256 + if FIFTH { 64 } else { 0 };
    /// Bytes before the values: the two blocks' scales, then (with minimums) their minimums.
    const HEAD: usize = if MIN { 128 } else { 64 };
    /// Where the fifth bits and the nibbles start in a block of the file.
    const QH: usize = if MIN { 4 } else { 2 };
    const QS: usize = Self::QH + if FIFTH { 4 } else { 0 };
}

impl<const MIN: bool, const FIFTH: bool> Format for Nib<MIN, FIFTH> {
    const BLOCK: usize = Self::QS + 16;
    const BLOCK_UNITS: usize = 1;
    const UNITS: usize = 2;
    const CHUNK: usize = Self::HEAD + 2 * Self::VALUES;
    const OFFSET: i32 = if MIN {
        0
    } else if FIFTH {
        16
    } else {
        8
    };
    fn pack(src: &[u8], b: usize, j: usize, chunk: &mut [u8]) {
        chunk[(b % 2) * 32 + 2 * j..][..2].copy_from_slice(&src[..2]);
        if MIN {
            chunk[64 + (b % 2) * 32 + 2 * j..][..2].copy_from_slice(&src[2..4]);
        }
        let values = &mut chunk[Self::HEAD + (b % 2) * Self::VALUES..];
        for v in 0..4 {
            values[v * 64 + 4 * j..][..4].copy_from_slice(&src[Self::QS + 4 * v..][..4]);
        }
        if FIFTH {
            let q = &src[Self::QH..Self::QH + 4];
            let qh = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
            let mut h = 0u32;
            for g in 0..8 {
                for i in 0..4 {
                    h |= ((qh >> (4 * g + i)) & 1) << (8 * i + g);
                }
            }
            values[256 + 4 * j..][..4].copy_from_slice(&h.to_le_bytes());
        }
    }
    fn unpack(chunk: &[u8], b: usize, j: usize, dst: &mut [u8]) {
        dst[..2].copy_from_slice(&chunk[(b % 2) * 32 + 2 * j..][..2]);
        if MIN {
            dst[2..4].copy_from_slice(&chunk[64 + (b % 2) * 32 + 2 * j..][..2]);
        }
        let values = &chunk[Self::HEAD + (b % 2) * Self::VALUES..];
        for v in 0..4 {
            dst[Self::QS + 4 * v..][..4].copy_from_slice(&values[v * 64 + 4 * j..][..4]);
        }
        if FIFTH {
            let h = &values[256 + 4 * j..][..4];
            let h = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let mut qh = 0u32;
            for g in 0..8 {
                for i in 0..4 {
                    qh |= ((h >> (8 * i + g)) & 1) << (4 * g + i);
                }
            }
            dst[Self::QH..Self::QH + 4].copy_from_slice(&qh.to_le_bytes());
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 of 2-bit high parts, 16 signed 8-bit scales, f16 `d`.
pub(crate) struct Q6k;

/// Q6_K chunk offsets: the units' scales, values.
const Q6K_SC: usize = 64;
const Q6K_VALUES: usize = 64 + 8 * 32;

/// Where value `v` (0..256) of a Q6_K block lives: its low nibble's byte and shift in `ql`, its high
/// bits' byte and shift in `qh`, and its sub-block scale's index (ggml's `dequantize_row_q6_K`).
fn q6k_place(v: usize) -> (usize, u32, usize, u32, usize) {
    let (half, t, l) = (v / 128, (v % 128) / 32, v % 32);
    (
        64 * half + l + 32 * (t % 2),
        4 * (t as u32 / 2),
        128 + 32 * half + l,
        2 * t as u32,
        8 * half + 2 * t + l / 16,
    )
}

impl Format for Q6k {
    const BLOCK: usize = 210;
    const BLOCK_UNITS: usize = 8;
    const UNITS: usize = 8;
    const CHUNK: usize = Q6K_VALUES + 8 * 512;
    const OFFSET: i32 = 32;
    fn pack(src: &[u8], _: usize, j: usize, chunk: &mut [u8]) {
        chunk[2 * j..2 * j + 2].copy_from_slice(&src[208..210]);
        for u in 0..8 {
            for h in 0..2 {
                chunk[Q6K_SC + 32 * u + 16 * h + j] = src[192 + q6k_place(32 * u + 16 * h).4];
            }
        }
        for v in 0..256 {
            let (ql, ls, qh, hs, _) = q6k_place(v);
            let q = ((src[ql] >> ls) & 0xF) | (((src[qh] >> hs) & 3) << 4);
            chunk[Q6K_VALUES + 512 * (v / 32) + 64 * (v % 32 / 4) + 4 * j + v % 4] = q;
        }
    }
    fn unpack(chunk: &[u8], _: usize, j: usize, dst: &mut [u8]) {
        dst[208..210].copy_from_slice(&chunk[2 * j..2 * j + 2]);
        dst[..192].fill(0);
        for u in 0..8 {
            for h in 0..2 {
                dst[192 + q6k_place(32 * u + 16 * h).4] = chunk[Q6K_SC + 32 * u + 16 * h + j];
            }
        }
        for v in 0..256 {
            let (ql, ls, qh, hs, _) = q6k_place(v);
            let q = chunk[Q6K_VALUES + 512 * (v / 32) + 64 * (v % 32 / 4) + 4 * j + v % 4];
            dst[ql] |= (q & 0xF) << ls;
            dst[qh] |= (q >> 4) << hs;
        }
    }
}

/// Q4_K chunk offsets: `d`, `dmin`, the units' scales, minimums and values.
const Q4K_SC: usize = 64;
const Q4K_M: usize = 64 + 8 * 16;
const Q4K_VALUES: usize = 64 + 16 * 16;

impl Format for Q4k {
    const BLOCK: usize = 144;
    const BLOCK_UNITS: usize = 8;
    const UNITS: usize = 8;
    const CHUNK: usize = Q4K_VALUES + 4 * 512;
    const OFFSET: i32 = 0;
    fn pack(src: &[u8], _: usize, j: usize, chunk: &mut [u8]) {
        chunk[2 * j..2 * j + 2].copy_from_slice(&src[..2]);
        chunk[32 + 2 * j..32 + 2 * j + 2].copy_from_slice(&src[2..4]);
        for u in 0..8 {
            let (sc, m) = crate::quant::scale_min_k4(u, &src[4..16]);
            chunk[Q4K_SC + 16 * u + j] = sc;
            chunk[Q4K_M + 16 * u + j] = m;
        }
        for n in 0..4 {
            for v in 0..8 {
                let at = Q4K_VALUES + 512 * n + 64 * v + 4 * j;
                chunk[at..at + 4].copy_from_slice(&src[16 + 32 * n + 4 * v..][..4]);
            }
        }
    }
    fn unpack(chunk: &[u8], _: usize, j: usize, dst: &mut [u8]) {
        dst[..2].copy_from_slice(&chunk[2 * j..2 * j + 2]);
        dst[2..4].copy_from_slice(&chunk[32 + 2 * j..32 + 2 * j + 2]);
        let sc = |u: usize| chunk[Q4K_SC + 16 * u + j];
        let m = |u: usize| chunk[Q4K_M + 16 * u + j];
        // ggml's 12-byte packing of eight 6-bit scales and minimums (`scale_min_k4` reads it back).
        let q = &mut dst[4..16];
        for u in 0..4 {
            q[u] = sc(u) | ((sc(u + 4) >> 4) << 6);
            q[u + 4] = m(u) | ((m(u + 4) >> 4) << 6);
            q[u + 8] = (sc(u + 4) & 0xF) | ((m(u + 4) & 0xF) << 4);
        }
        for n in 0..4 {
            for v in 0..8 {
                let at = Q4K_VALUES + 512 * n + 64 * v + 4 * j;
                dst[16 + 32 * n + 4 * v..][..4].copy_from_slice(&chunk[at..at + 4]);
            }
        }
    }
}

/// Bytes the CPU kernels hold for a quantized matrix of `kind` stored in `stored` bytes: Q6_K's panels
/// widen its values to bytes (4416 bytes per 16 rows × 256 values, against 3360 in the file); the
/// other formats keep their size. An upper bound (panels are built only with AVX-512 VNNI), for
/// memory planning.
pub fn held_bytes(kind: QuantKind, stored: u64) -> u64 {
    match kind {
        QuantKind::Q6K => stored * Q6k::CHUNK as u64 / (NR * Q6k::BLOCK) as u64,
        _ => stored,
    }
}

/// A quantized matrix in panel layout (see the module header).
pub struct QPanels {
    kind: QuantKind,
    rows: usize,
    cols: usize,
    buf: Vec<Line>,
}

impl std::fmt::Debug for QPanels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QPanels({}x{} {:?})", self.rows, self.cols, self.kind)
    }
}

impl QPanels {
    /// Repacks `w` when it is a Q8_0, Q5_0, Q4_K or Q6_K matrix of at least [`NR`] rows; `None` otherwise.
    pub fn pack(w: &HostWeight) -> Option<Self> {
        match w.data() {
            WeightData::Quant(QuantKind::Q8_0, bytes) => Self::pack_as::<Q8>(QuantKind::Q8_0, w, bytes),
            WeightData::Quant(QuantKind::Q4_0, bytes) => Self::pack_as::<Q4_0>(QuantKind::Q4_0, w, bytes),
            WeightData::Quant(QuantKind::Q4_1, bytes) => Self::pack_as::<Q4_1>(QuantKind::Q4_1, w, bytes),
            WeightData::Quant(QuantKind::Q5_0, bytes) => Self::pack_as::<Q5>(QuantKind::Q5_0, w, bytes),
            WeightData::Quant(QuantKind::Q5_1, bytes) => Self::pack_as::<Q5_1>(QuantKind::Q5_1, w, bytes),
            WeightData::Quant(QuantKind::Q4K, bytes) => Self::pack_as::<Q4k>(QuantKind::Q4K, w, bytes),
            WeightData::Quant(QuantKind::Q6K, bytes) => Self::pack_as::<Q6k>(QuantKind::Q6K, w, bytes),
            _ => None,
        }
    }

    fn pack_as<F: Format>(kind: QuantKind, w: &HostWeight, bytes: &[u8]) -> Option<Self> {
        let (rows, cols) = (w.rows(), w.cols());
        if rows < NR {
            return None;
        }
        let nb = cols / 32 / F::BLOCK_UNITS;
        let blocks_per_chunk = F::UNITS / F::BLOCK_UNITS;
        let panel_lines = nb.div_ceil(blocks_per_chunk) * F::CHUNK / 64;
        let mut buf = vec![Line([0; 64]); rows.div_ceil(NR) * panel_lines];
        pool::for_each_chunk(&mut buf, panel_lines, 1, |p, lines| {
            // SAFETY: `Line` is 64 plain bytes with no padding.
            let out =
                unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), lines.len() * 64) };
            // Padding rows (past `rows`) stay zero: scale 0, so their (discarded) sums are 0.
            for j in 0..NR.min(rows - p * NR) {
                let row = p * NR + j;
                for b in 0..nb {
                    let c = b / blocks_per_chunk;
                    let src = &bytes[(row * nb + b) * F::BLOCK..(row * nb + b + 1) * F::BLOCK];
                    F::pack(src, b, j, &mut out[c * F::CHUNK..(c + 1) * F::CHUNK]);
                }
            }
        });
        Some(Self {
            kind,
            rows,
            cols,
            buf,
        })
    }

    /// Output rows (`n`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns (`k`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes with no padding.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.buf.len() * 64) }
    }

    /// Bytes of one panel.
    fn panel_bytes(&self) -> usize {
        fn of<F: Format>(cols: usize) -> usize {
            (cols / 32).div_ceil(F::UNITS) * F::CHUNK
        }
        match self.kind {
            QuantKind::Q8_0 => of::<Q8>(self.cols),
            QuantKind::Q4_0 => of::<Q4_0>(self.cols),
            QuantKind::Q4_1 => of::<Q4_1>(self.cols),
            QuantKind::Q5_0 => of::<Q5>(self.cols),
            QuantKind::Q5_1 => of::<Q5_1>(self.cols),
            QuantKind::Q4K => of::<Q4k>(self.cols),
            _ => of::<Q6k>(self.cols),
        }
    }

    /// Row `j` in the file's layout.
    fn row_in_file_layout(&self, j: usize) -> Vec<u8> {
        match self.kind {
            QuantKind::Q8_0 => self.row_as::<Q8>(j),
            QuantKind::Q4_0 => self.row_as::<Q4_0>(j),
            QuantKind::Q4_1 => self.row_as::<Q4_1>(j),
            QuantKind::Q5_0 => self.row_as::<Q5>(j),
            QuantKind::Q5_1 => self.row_as::<Q5_1>(j),
            QuantKind::Q4K => self.row_as::<Q4k>(j),
            _ => self.row_as::<Q6k>(j),
        }
    }

    fn row_as<F: Format>(&self, j: usize) -> Vec<u8> {
        let panel = &self.bytes()[(j / NR) * self.panel_bytes()..];
        let per_chunk = F::UNITS / F::BLOCK_UNITS;
        let mut row = vec![0u8; self.cols / 32 / F::BLOCK_UNITS * F::BLOCK];
        for (b, blk) in row.chunks_exact_mut(F::BLOCK).enumerate() {
            F::unpack(&panel[(b / per_chunk) * F::CHUNK..], b, j % NR, blk);
        }
        row
    }

    /// Row `j` as f32 (embedding lookups).
    pub fn row_to_f32(&self, j: usize, out: &mut [f32]) {
        crate::quant::dequantize_row(self.kind, &self.row_in_file_layout(j), &mut out[..self.cols]);
    }

    /// The matrix in the file's layout again.
    pub fn to_host(&self) -> HostWeight {
        let bytes: Vec<u8> = (0..self.rows).flat_map(|j| self.row_in_file_layout(j)).collect();
        let len = bytes.len();
        HostWeight::new(
            std::sync::Arc::new(bytes),
            0,
            len,
            DType::Quant(self.kind),
            self.rows,
            self.cols,
        )
        .expect("a matrix rebuilt from its own panels has its own shape")
    }
}

/// `out = x · Wᵀ (+ bias)`, `x` being `rows × k`.
///
/// # Panics
/// If the CPU lacks AVX-512 VNNI (callers pack only for `Isa::Avx512`) or the shapes disagree.
pub(crate) fn matmul(x: &[f32], rows: usize, w: &QPanels, bias: Option<WeightData<'_>>, out: &mut [f32]) {
    let (k, n) = (w.cols, w.rows);
    assert!(
        x.len() >= rows * k && out.len() >= rows * n,
        "matmul shape mismatch"
    );
    assert!(
        super::simd::Isa::Avx512.is_available(),
        "integer panels need AVX-512 VNNI"
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "bias length");
    }
    if rows == 0 {
        return;
    }
    let xq = super::qdot::quantize_rows(x, rows, k);
    // Each block's Σ x_q over values 0–15 and 16–31 (Q6_K's sub-blocks; the others add the two).
    let half = |q: &[i8]| q.iter().map(|&v| i32::from(v)).sum::<i32>();
    let sums: Vec<[i32; 2]> = xq
        .iter()
        .map(|b| [half(&b.qs[..16]), half(&b.qs[16..])])
        .collect();
    let nb = k / 32;
    let panels = n.div_ceil(NR);
    let pb = w.panel_bytes();
    // Panels per task: a block of them stays in L2 (256 KiB) while every row tile passes over it,
    // and at least 4 tasks per thread for balance.
    let by_cache = (256 * 1024 / pb).clamp(1, 64);
    let per_task = by_cache.min(panels.div_ceil(4 * pool::threads())).max(1);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let base = w.bytes();
    let mut bias_f32 = vec![0.0f32; n];
    if let Some(b) = bias {
        b.copy_to_f32(0, &mut bias_f32);
    }
    let bias = &bias_f32;
    pool::for_each(panels.div_ceil(per_task), |t| {
        let (p0, p1) = (t * per_task, ((t + 1) * per_task).min(panels));
        for (r, tile) in x86::row_tiles(rows) {
            let step = x86::panels_for(tile);
            let mut p = p0;
            while p < p1 {
                let np = (p1 - p).min(step);
                let mut acc = [[[0.0f32; NR]; x86::MP]; x86::MR];
                let args = x86::TileArgs {
                    kind: w.kind,
                    nb,
                    pb,
                    ws: &base[p * pb..(p + np) * pb],
                    xs: &xq[r * nb..(r + tile) * nb],
                    ss: &sums[r * nb..(r + tile) * nb],
                };
                // SAFETY: AVX-512 VNNI was asserted above; `ws` holds `np ≤ panels_for(tile)` whole
                // panels of `nb` blocks of `w.kind`, `xs`/`ss` `tile ≤ MR` rows of `nb` blocks.
                unsafe { x86::tile_dispatch(&args, tile, np, &mut acc) };
                // SAFETY: rows `r..r + tile` (`≤ rows`) × panels `p..p + np` (`≤ panels`) are this
                // task's, and `out` holds `rows · n` values (checked above).
                unsafe { out_ptr.put_tile(n, r, p, &acc[..tile], np, bias) };
                p += np;
            }
        }
    });
}

#[cfg(target_arch = "x86_64")]
#[path = "qpanels_x86.rs"]
mod x86;

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    pub(super) const MR: usize = 1;
    pub(super) const MP: usize = 1;
    pub(super) fn panels_for(_: usize) -> usize {
        1
    }
    pub(super) fn row_tiles(rows: usize) -> impl Iterator<Item = (usize, usize)> {
        (0..rows).map(|r| (r, 1))
    }
    pub(super) struct TileArgs<'a> {
        pub kind: crate::quant::QuantKind,
        pub nb: usize,
        pub pb: usize,
        pub ws: &'a [u8],
        pub xs: &'a [crate::cpu::qdot::Q8Block],
        pub ss: &'a [[i32; 2]],
    }
    /// Never reached: panels are only built for `Isa::Avx512`.
    pub(super) unsafe fn tile_dispatch(
        _: &TileArgs<'_>,
        _: usize,
        _: usize,
        _: &mut [[[f32; super::NR]; MP]; MR],
    ) {
        unreachable!("integer panels off x86-64")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd::Isa;
    use crate::cpu::test_data::lcg;

    #[test]
    fn panels_round_trip_and_match_the_row_tiles() {
        if !Isa::Avx512.is_available() {
            eprintln!("skipped: no AVX-512 VNNI here");
            return;
        }
        let pool = pool::Pool::new(2);
        for kind in QuantKind::ALL {
            let shapes: &[(usize, usize, usize)] = if kind.block_elems() == 256 {
                &[
                    (1, 256, 16),
                    (3, 512, 17),
                    (4, 256, 40),
                    (9, 1536, 33),
                    (16, 1536, 50),
                ]
            } else {
                &[
                    (1, 32, 16),
                    (3, 64, 17),
                    (4, 96, 40),
                    (9, 576, 33),
                    (16, 1536, 50),
                ]
            };
            for &(rows, k, n) in shapes {
                let bytes = crate::quant::test_blocks::blocks(kind, n * k / kind.block_elems());
                let len = bytes.len();
                let w =
                    HostWeight::new(std::sync::Arc::new(bytes), 0, len, DType::Quant(kind), n, k).unwrap();
                let p = pool.scope(|| QPanels::pack(&w)).unwrap();
                let case = format!("{kind:?} {rows}x{k}x{n}");
                // The file's bytes come back, and embedding rows dequantize as the file's.
                let WeightData::Quant(_, want) = w.data() else {
                    unreachable!()
                };
                let back = p.to_host();
                let WeightData::Quant(_, got) = back.data() else {
                    unreachable!()
                };
                assert!(got == want, "{case}: round trip");
                let (mut row, mut deq) = (vec![0.0; k], vec![0.0; k]);
                p.row_to_f32(n - 1, &mut row);
                let rb = k / kind.block_elems() * kind.block_bytes();
                crate::quant::dequantize_row(kind, &want[(n - 1) * rb..n * rb], &mut deq);
                assert_eq!(row, deq, "{case}: last row");

                // Against the row-layout integer tiles: the same integer sums, rounding order apart.
                let x = lcg(3, rows * k);
                let b = HostWeight::from_f32(&lcg(5, n), 1, n).unwrap();
                let mut ours = vec![0.0; rows * n];
                pool.scope(|| matmul(&x, rows, &p, Some(b.data()), &mut ours));
                let mut theirs = vec![0.0; rows * n];
                let shape = crate::cpu::matmul::MatmulShape { rows, k, n };
                pool.scope(|| {
                    crate::cpu::matmul::matmul(Isa::Avx512, &x, w.data(), Some(b.data()), shape, &mut theirs)
                });
                let mut deq = vec![0.0; n * k];
                w.data().copy_to_f32(0, &mut deq);
                for (i, (a, t)) in ours.iter().zip(&theirs).enumerate() {
                    let (r, c) = (i / n, i % n);
                    let scale: f32 = (0..k).map(|j| (x[r * k + j] * deq[c * k + j]).abs()).sum();
                    assert!((a - t).abs() <= 1e-5 * (1.0 + scale), "{case} at {i}: {a} vs {t}");
                }
                // Batch invariance: each row alone gives the same bits.
                for r in 0..rows {
                    let mut alone = vec![0.0; n];
                    pool.scope(|| matmul(&x[r * k..(r + 1) * k], 1, &p, Some(b.data()), &mut alone));
                    assert!(
                        alone
                            .iter()
                            .zip(&ours[r * n..(r + 1) * n])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{case}: row {r} alone differs"
                    );
                }
            }
        }
    }
    #[test]
    fn tiles_of_every_row_count_match_an_f64_reference_and_keep_rows_batch_invariant() {
        if !Isa::Avx512.is_available() {
            eprintln!("skipped: no AVX-512 VNNI here");
            return;
        }
        // One tile (up to 6 rows), two (7–12), three or four (13–24) and tiles of 4 (25); 40 outputs:
        // a partial panel.
        let (k, n) = (512, 40);
        for kind in QuantKind::ALL {
            let bytes = crate::quant::test_blocks::blocks(kind, n * k / kind.block_elems());
            let len = bytes.len();
            let w = HostWeight::new(std::sync::Arc::new(bytes), 0, len, DType::Quant(kind), n, k).unwrap();
            let mut wd = vec![0.0; n * k];
            w.data().copy_to_f32(0, &mut wd);
            for threads in [1, 3] {
                let pool = pool::Pool::new(threads);
                let p = pool.scope(|| QPanels::pack(&w)).unwrap();
                for rows in (1..=13).chain([20, 24, 25]) {
                    let x = lcg(rows as u64, rows * k);
                    let mut ours = vec![0.0; rows * n];
                    pool.scope(|| matmul(&x, rows, &p, None, &mut ours));
                    // The reference: the 8-bit activations the tiles multiply, widened, against the
                    // dequantized weights, in f64.
                    let xq = crate::cpu::qdot::quantize_rows(&x, rows, k);
                    let xd: Vec<f64> = xq
                        .iter()
                        .flat_map(|b| b.qs.iter().map(move |&q| f64::from(q) * f64::from(b.d)))
                        .collect();
                    for (i, got) in ours.iter().enumerate() {
                        let (r, c) = (i / n, i % n);
                        let terms = (0..k).map(|j| xd[r * k + j] * f64::from(wd[c * k + j]));
                        let (want, scale) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                        let case = format!("{kind:?} {rows} rows on {threads} threads at ({r}, {c})");
                        assert!(
                            (f64::from(*got) - want).abs() <= 2e-3 * (1.0 + scale),
                            "{case}: {got} vs {want}"
                        );
                    }
                    // Each row alone gives the same bits as in the batch, whatever its tile.
                    for r in 0..rows {
                        let mut alone = vec![0.0; n];
                        pool.scope(|| matmul(&x[r * k..(r + 1) * k], 1, &p, None, &mut alone));
                        let same = alone
                            .iter()
                            .zip(&ours[r * n..])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{kind:?} {rows} rows on {threads} threads: row {r} alone differs"
                        );
                    }
                }
            }
        }
    }
}
