//! The GGUF container (llama.cpp's model format, versions 2 and 3): metadata key/values and tensor
//! descriptors, read from a memory map without copying tensor data.
//!
//! Invariants: every read is bounds-checked — a truncated or corrupt file is an
//! [`EngineError::Weights`] naming the file and what was being read, never a panic or an out-of-bounds
//! access; tensor data offsets are checked against the file length before any weight is built from
//! them. Format: `ggml/docs/gguf.md` in the llama.cpp repository.

use super::weights::Mapped;
use crate::error::{EngineError, Result};
use modelfleet_kernels::{DType, QuantKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// `f32` or `f64`.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array of values.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U64(v) => Some(v),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F64(v) => Some(v),
            GgufValue::U64(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensor {
    /// llama.cpp's tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, innermost first (GGML's `ne`).
    pub dims: Vec<usize>,
    /// GGML type id.
    pub ggml_type: u32,
    /// Absolute byte range in the file.
    pub start: usize,
    /// End of the byte range.
    pub end: usize,
}

/// A parsed GGUF file.
pub struct GgufFile {
    /// The file.
    pub path: PathBuf,
    /// Format version.
    pub version: u32,
    /// Metadata by key.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor descriptors in file order.
    pub tensors: Vec<GgufTensor>,
    pub(crate) map: Arc<Mapped>,
}

/// The dtype of a GGML type id, or why it is unsupported.
pub fn ggml_dtype(t: u32) -> std::result::Result<DType, String> {
    Ok(match t {
        0 => DType::F32,
        1 => DType::F16,
        30 => DType::BF16,
        2 => DType::Quant(QuantKind::Q4_0),
        3 => DType::Quant(QuantKind::Q4_1),
        6 => DType::Quant(QuantKind::Q5_0),
        7 => DType::Quant(QuantKind::Q5_1),
        8 => DType::Quant(QuantKind::Q8_0),
        12 => DType::Quant(QuantKind::Q4K),
        14 => DType::Quant(QuantKind::Q6K),
        other => {
            return Err(format!(
                "GGML type {other} is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K)"
            ));
        }
    })
}

/// A bounds-checked reader over the file bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, what: &str) -> EngineError {
        EngineError::Weights {
            path: self.path.to_path_buf(),
            tensor: "*".into(),
            message: format!(
                "truncated or corrupt GGUF at byte {} while reading {what}",
                self.pos
            ),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| self.err(what))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }

    fn len(&mut self, what: &str) -> Result<usize> {
        let n = self.u64(what)?;
        // Every element takes at least one byte, so a length past the file is corrupt.
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.bytes.len())
            .ok_or_else(|| self.err(what))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.len(what)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err(&format!("{what} (not UTF-8)")))
    }

    fn value(&mut self, ty: u32, key: &str) -> Result<GgufValue> {
        let mut n = |size: usize| -> Result<u64> {
            let b = self.take(size, key)?;
            let mut buf = [0u8; 8];
            buf[..size].copy_from_slice(b);
            Ok(u64::from_le_bytes(buf))
        };
        Ok(match ty {
            0 => GgufValue::U64(n(1)?),
            1 => GgufValue::I64(n(1)? as u8 as i8 as i64),
            2 => GgufValue::U64(n(2)?),
            3 => GgufValue::I64(n(2)? as u16 as i16 as i64),
            4 => GgufValue::U64(n(4)?),
            5 => GgufValue::I64(n(4)? as u32 as i32 as i64),
            6 => GgufValue::F64(f32::from_bits(n(4)? as u32) as f64),
            7 => GgufValue::Bool(n(1)? != 0),
            8 => GgufValue::Str(self.string(key)?),
            9 => {
                let inner = self.u32(key)?;
                let count = self.len(key)?;
                let mut items = Vec::with_capacity(count.min(1 << 20));
                for _ in 0..count {
                    items.push(self.value(inner, key)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(n(8)?),
            11 => GgufValue::I64(n(8)? as i64),
            12 => GgufValue::F64(f64::from_bits(n(8)?)),
            other => return Err(self.err(&format!("{key} (unknown value type {other})"))),
        })
    }
}

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let map = Mapped::open(path)?;
        let bytes: &[u8] = &map.0;
        let mut c = Cursor { bytes, pos: 0, path };
        if c.take(4, "the magic")? != b"GGUF" {
            return Err(EngineError::Weights {
                path: path.into(),
                tensor: "*".into(),
                message: "not a GGUF file (bad magic)".into(),
            });
        }
        let version = c.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(EngineError::Weights {
                path: path.into(),
                tensor: "*".into(),
                message: format!("GGUF version {version} is not supported (2, 3)"),
            });
        }
        let n_tensors = c.len("the tensor count")?;
        let n_kv = c.len("the metadata count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("a metadata key")?;
            let ty = c.u32(&key)?;
            let v = c.value(ty, &key)?;
            metadata.insert(key, v);
        }
        let mut raw = Vec::with_capacity(n_tensors.min(1 << 16));
        for _ in 0..n_tensors {
            let name = c.string("a tensor name")?;
            let n_dims = c.u32(&name)? as usize;
            if n_dims > 4 {
                return Err(c.err(&format!("{name} ({n_dims} dimensions)")));
            }
            let dims = (0..n_dims)
                .map(|_| c.u64(&name).map(|d| d as usize))
                .collect::<Result<Vec<usize>>>()?;
            let ggml_type = c.u32(&name)?;
            let offset = usize::try_from(c.u64(&name)?).unwrap_or(usize::MAX);
            raw.push((name, dims, ggml_type, offset));
        }
        let align = metadata
            .get("general.alignment")
            .and_then(GgufValue::as_u64)
            .unwrap_or(32) as usize;
        if align == 0 || !align.is_power_of_two() {
            return Err(c.err("general.alignment (not a power of two)"));
        }
        let data_start = c.pos.next_multiple_of(align);
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ggml_type, offset) in raw {
            let cols = dims.first().copied().unwrap_or(1);
            let rows = dims.iter().skip(1).try_fold(1usize, |a, &d| a.checked_mul(d));
            // Unsupported types keep a zero-length range; using them reports the type.
            let len = match (ggml_dtype(ggml_type).ok().and_then(|d| d.row_bytes(cols)), rows) {
                (None, _) => Some(0),
                (Some(rb), Some(rows)) => rb.checked_mul(rows),
                (Some(_), None) => None,
            };
            let start = data_start.checked_add(offset);
            let end = start
                .zip(len)
                .and_then(|(s, l)| s.checked_add(l))
                .filter(|&e| e <= bytes.len());
            let (Some(start), Some(end)) = (start, end) else {
                return Err(EngineError::Weights {
                    path: path.into(),
                    tensor: name,
                    message: format!("data at offset {offset} runs past the end of the file"),
                });
            };
            tensors.push(GgufTensor {
                name,
                dims,
                ggml_type,
                start,
                end,
            });
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            map: map.clone(),
        })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }
}

pub mod writer;

#[cfg(test)]
mod tests {
    use super::writer::{TensorHeader, write};
    use super::*;

    #[test]
    fn written_files_read_back_with_metadata_and_aligned_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let meta = vec![
            ("a.u".to_string(), GgufValue::U64(7)),
            ("a.i".to_string(), GgufValue::I64(-3)),
            ("a.f".to_string(), GgufValue::F64(0.5)),
            ("a.b".to_string(), GgufValue::Bool(true)),
            ("a.s".to_string(), GgufValue::Str("héllo".into())),
            (
                "a.arr".to_string(),
                GgufValue::Array(vec![GgufValue::Str("x".into()), GgufValue::Str("y z".into())]),
            ),
        ];
        let tensors = vec![
            TensorHeader {
                name: "t.f32".into(),
                dims: vec![3],
                ggml_type: 0,
                len: 12,
            },
            TensorHeader {
                name: "t.q8".into(),
                dims: vec![32, 2],
                ggml_type: 8,
                len: 68,
            },
        ];
        let mut out = Vec::new();
        write(&mut out, &meta, &tensors, |i| vec![i as u8 + 1; tensors[i].len]).unwrap();
        std::fs::write(&path, &out).unwrap();
        let g = GgufFile::open(&path).unwrap();
        assert_eq!(g.version, 3);
        for (k, v) in &meta {
            assert_eq!(g.get(k), Some(v), "{k}");
        }
        assert_eq!(g.tensors.len(), 2);
        assert_eq!(
            (g.tensors[1].dims.clone(), g.tensors[1].end - g.tensors[1].start),
            (vec![32, 2], 68)
        );
        assert!(g.tensors.iter().all(|t| t.start % 32 == 0));
        assert_eq!(out[g.tensors[1].start], 2);
        let mut bad = Vec::new();
        let wrong = [TensorHeader {
            name: "t".into(),
            dims: vec![3],
            ggml_type: 0,
            len: 12,
        }];
        assert!(write(&mut bad, &meta, &wrong, |_| vec![0; 5]).is_err());
    }

    #[test]
    fn unsupported_types_are_named() {
        assert!(ggml_dtype(10).unwrap_err().contains("GGML type 10"));
        assert_eq!(ggml_dtype(6), Ok(DType::Quant(QuantKind::Q5_0)));
        assert_eq!(ggml_dtype(14), Ok(DType::Quant(QuantKind::Q6K)));
    }
}
