//! Host-resident weights: a dtype-tagged, zero-copy view of bytes owned by a memory map or a vector.
//!
//! Invariants: a [`HostWeight`]'s bytes are little-endian, suitably aligned for its dtype (construction
//! copies misaligned data into an aligned owned buffer instead of failing), and exactly
//! `rows * dtype.row_bytes(cols)` long; a block-quantized row holds whole blocks. Weights stay in their
//! stored dtype; kernels convert to f32 as they read, so f16/bf16 models use half the memory bandwidth of
//! f32 ones and quantized models less still.

use crate::quant::{QuantKind, dequantize_block, dequantize_row};
use half::{bf16, f16};
use std::fmt;
use std::sync::Arc;

#[cfg(target_endian = "big")]
compile_error!(
    "modelfleet-kernels reads little-endian weight files in place and needs a little-endian target"
);

/// Element type of a stored weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the top half of a binary32).
    BF16,
    /// A GGML block-quantized format.
    Quant(QuantKind),
}

impl DType {
    /// Bytes of a row of `cols` elements, or `None` when `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        match self {
            DType::F32 => Some(cols * 4),
            DType::F16 | DType::BF16 => Some(cols * 2),
            DType::Quant(q) => cols
                .is_multiple_of(q.block_elems())
                .then(|| cols / q.block_elems() * q.block_bytes()),
        }
    }

    /// Alignment the typed view needs (quantized blocks are read byte-wise).
    pub fn align(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Quant(_) => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Quant(q) => q.name(),
        })
    }
}

/// Whatever owns the bytes of one or more weights (a memory-mapped file, a vector).
pub trait ByteSource: Send + Sync {
    /// All the bytes this source holds.
    fn bytes(&self) -> &[u8];
}

impl ByteSource for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// An owned buffer aligned for every dtype (backed by `u32`s).
struct Aligned {
    words: Vec<u32>,
    len: usize,
}

impl ByteSource for Aligned {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

/// Why a weight could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WeightError {
    /// A quantized row is not a whole number of blocks.
    #[error("{cols} columns are not a whole number of {dtype} blocks")]
    Blocks {
        /// Columns of the matrix.
        cols: usize,
        /// Element type.
        dtype: DType,
    },
    /// The byte range does not match the shape and dtype.
    #[error("expected {expected} bytes for {rows}x{cols} {dtype}, found {found}")]
    Size {
        /// Rows of the matrix (1 for a vector).
        rows: usize,
        /// Columns of the matrix.
        cols: usize,
        /// Element type.
        dtype: DType,
        /// `rows * dtype.row_bytes(cols)`.
        expected: usize,
        /// The length of the byte range given.
        found: usize,
    },
    /// Only Q8_0 and Q4_0 can be produced from f32 here.
    #[error("no quantizer for {0}")]
    NoQuantizer(DType),
    /// The byte range lies outside its source.
    #[error("byte range {start}..{end} lies outside a source of {len} bytes")]
    Range {
        /// Start of the range.
        start: usize,
        /// End of the range.
        end: usize,
        /// Length of the source.
        len: usize,
    },
}

/// A borrowed, typed view of a weight's elements.
#[derive(Clone, Copy, Debug)]
pub enum WeightData<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// f16 elements.
    F16(&'a [f16]),
    /// bf16 elements.
    BF16(&'a [bf16]),
    /// Whole blocks of a quantized format.
    Quant(QuantKind, &'a [u8]),
}

impl WeightData<'_> {
    /// Element `i` as f32.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            WeightData::F32(d) => d[i],
            WeightData::F16(d) => d[i].to_f32(),
            WeightData::BF16(d) => d[i].to_f32(),
            WeightData::Quant(q, b) => {
                let (be, bb) = (q.block_elems(), q.block_bytes());
                let mut block = [0.0f32; 256];
                dequantize_block(*q, &b[i / be * bb..(i / be + 1) * bb], &mut block);
                block[i % be]
            }
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            WeightData::F32(d) => d.len(),
            WeightData::F16(d) => d.len(),
            WeightData::BF16(d) => d.len(),
            WeightData::Quant(q, b) => b.len() / q.block_bytes() * q.block_elems(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `start..start + out.len()` converted to f32 into `out`; for quantized data both ends
    /// must fall on block boundaries (a row always does).
    pub fn copy_to_f32(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            WeightData::F32(d) => out.copy_from_slice(&d[start..end]),
            WeightData::F16(d) => out
                .iter_mut()
                .zip(&d[start..end])
                .for_each(|(o, v)| *o = v.to_f32()),
            WeightData::BF16(d) => out
                .iter_mut()
                .zip(&d[start..end])
                .for_each(|(o, v)| *o = v.to_f32()),
            WeightData::Quant(q, b) => {
                let (be, bb) = (q.block_elems(), q.block_bytes());
                assert!(
                    start.is_multiple_of(be) && end.is_multiple_of(be),
                    "quantized copy off block boundaries"
                );
                dequantize_row(*q, &b[start / be * bb..end / be * bb], out);
            }
        }
    }
}

/// A weight matrix `[rows, cols]` (row-major; a vector has `rows == 1`) in its stored dtype, held in
/// host memory without copying when the source is aligned.
#[derive(Clone)]
pub struct HostWeight {
    source: Arc<dyn ByteSource>,
    start: usize,
    end: usize,
    dtype: DType,
    rows: usize,
    cols: usize,
}

impl fmt::Debug for HostWeight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostWeight({}x{} {})", self.rows, self.cols, self.dtype)
    }
}

impl HostWeight {
    /// A view of `source[start..end]` as a `rows x cols` matrix of `dtype`. Misaligned data is copied
    /// into an aligned buffer (safetensors files written by `safetensors` are aligned; others may not be).
    pub fn new(
        source: Arc<dyn ByteSource>,
        start: usize,
        end: usize,
        dtype: DType,
        rows: usize,
        cols: usize,
    ) -> Result<Self, WeightError> {
        let len = source.bytes().len();
        if start > end || end > len {
            return Err(WeightError::Range { start, end, len });
        }
        let expected = rows * dtype.row_bytes(cols).ok_or(WeightError::Blocks { cols, dtype })?;
        if end - start != expected {
            return Err(WeightError::Size {
                rows,
                cols,
                dtype,
                expected,
                found: end - start,
            });
        }
        let misaligned = !(source.bytes()[start..].as_ptr() as usize).is_multiple_of(dtype.align());
        if misaligned {
            let bytes = &source.bytes()[start..end];
            let mut words = vec![0u32; bytes.len().div_ceil(4)];
            bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
            let owned = Aligned {
                words,
                len: bytes.len(),
            };
            return Ok(Self {
                source: Arc::new(owned),
                start: 0,
                end: expected,
                dtype,
                rows,
                cols,
            });
        }
        Ok(Self {
            source,
            start,
            end,
            dtype,
            rows,
            cols,
        })
    }

    /// An owned f32 matrix (tests, and weights computed at load time).
    pub fn from_f32(values: &[f32], rows: usize, cols: usize) -> Result<Self, WeightError> {
        let words: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        let len = values.len() * 4;
        Self::new(Arc::new(Aligned { words, len }), 0, len, DType::F32, rows, cols)
    }

    /// An owned matrix in `dtype`, rounded from f32 values (quantized: Q8_0 and Q4_0 only).
    pub fn from_f32_as(values: &[f32], rows: usize, cols: usize, dtype: DType) -> Result<Self, WeightError> {
        match dtype {
            DType::F32 => Self::from_f32(values, rows, cols),
            DType::Quant(q) => {
                if !cols.is_multiple_of(q.block_elems()) {
                    return Err(WeightError::Blocks { cols, dtype });
                }
                let bytes = match q {
                    QuantKind::Q8_0 => crate::quant::quantize_q8_0(values),
                    QuantKind::Q4_0 => crate::quant::quantize_q4_0(values),
                    _ => return Err(WeightError::NoQuantizer(dtype)),
                };
                let len = bytes.len();
                Self::new(Arc::new(bytes), 0, len, dtype, rows, cols)
            }
            DType::F16 | DType::BF16 => {
                let halves: Vec<u16> = values
                    .iter()
                    .map(|&v| match dtype {
                        DType::F16 => f16::from_f32(v).to_bits(),
                        _ => bf16::from_f32(v).to_bits(),
                    })
                    .collect();
                let bytes: Vec<u8> = bytemuck::cast_slice(&halves).to_vec();
                let len = bytes.len();
                Self::new(Arc::new(bytes), 0, len, dtype, rows, cols)
            }
        }
    }

    /// The typed elements.
    pub fn data(&self) -> WeightData<'_> {
        let bytes = &self.source.bytes()[self.start..self.end];
        // Alignment and length were checked in `new`, so these casts cannot fail.
        match self.dtype {
            DType::F32 => WeightData::F32(bytemuck::cast_slice(bytes)),
            DType::F16 => WeightData::F16(bytemuck::cast_slice(bytes)),
            DType::BF16 => WeightData::BF16(bytemuck::cast_slice(bytes)),
            DType::Quant(q) => WeightData::Quant(q, bytes),
        }
    }

    /// The same weight in a buffer of its own, so it no longer keeps its source (e.g. a whole memory-mapped
    /// file) alive.
    pub fn to_owned_copy(&self) -> HostWeight {
        let bytes = &self.source.bytes()[self.start..self.end];
        let mut words = vec![0u32; bytes.len().div_ceil(4)];
        bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        let len = bytes.len();
        Self {
            source: Arc::new(Aligned { words, len }),
            start: 0,
            end: len,
            ..self.clone()
        }
    }

    /// Stored element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of rows (output features of a linear layer).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (input features of a linear layer).
    pub fn cols(&self) -> usize {
        self.cols
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misaligned_source_is_copied_and_reads_the_same() {
        let values = [1.0f32, -2.5, 3.25];
        let mut bytes = vec![0u8];
        bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        let w = HostWeight::new(Arc::new(bytes), 1, 13, DType::F32, 1, 3).unwrap();
        assert_eq!((0..3).map(|i| w.data().get(i)).collect::<Vec<_>>(), values);
    }

    #[test]
    fn wrong_size_and_range_are_errors() {
        let src: Arc<dyn ByteSource> = Arc::new(vec![0u8; 8]);
        assert!(matches!(
            HostWeight::new(src.clone(), 0, 8, DType::F32, 1, 3),
            Err(WeightError::Size {
                expected: 12,
                found: 8,
                ..
            })
        ));
        assert!(matches!(
            HostWeight::new(src, 4, 12, DType::F16, 1, 4),
            Err(WeightError::Range { .. })
        ));
    }

    #[test]
    fn half_types_round_trip() {
        let v = [0.5f32, -1.0, 2.0, 0.125];
        for dt in [DType::F16, DType::BF16] {
            let w = HostWeight::from_f32_as(&v, 2, 2, dt).unwrap();
            let mut out = [0.0; 4];
            w.data().copy_to_f32(0, &mut out);
            assert_eq!(out, v);
        }
    }
}
