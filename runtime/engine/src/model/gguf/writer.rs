//! Writing GGUF v3 files, for `gen-model --format gguf` and tests: metadata with integers as u32/i32
//! and floats as f32 (the types llama.cpp's loader expects for the keys we write), tensors aligned to 32
//! bytes, data streamed tensor by tensor so large models need not fit in memory twice.
//!
//! Invariants: the output is read back by [`super::GgufFile`] and by llama.cpp's `gguf-py` reader;
//! a tensor whose data length disagrees with its header is an error, not a corrupt file.

use super::GgufValue;

/// A tensor's descriptor: llama.cpp name, dims innermost first, GGML type id, data length.
pub struct TensorHeader {
    /// Name.
    pub name: String,
    /// Dimensions, innermost first.
    pub dims: Vec<usize>,
    /// GGML type id.
    pub ggml_type: u32,
    /// Bytes of encoded data.
    pub len: usize,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn value(out: &mut Vec<u8>, v: &GgufValue, with_type: bool) {
    let ty = |out: &mut Vec<u8>, t: u32| {
        if with_type {
            out.extend(t.to_le_bytes());
        }
    };
    match v {
        GgufValue::U64(x) => {
            ty(out, 4);
            out.extend((*x as u32).to_le_bytes());
        }
        GgufValue::I64(x) => {
            ty(out, 5);
            out.extend((*x as i32).to_le_bytes());
        }
        GgufValue::F64(x) => {
            ty(out, 6);
            out.extend((*x as f32).to_le_bytes());
        }
        GgufValue::Bool(b) => {
            ty(out, 7);
            out.push(*b as u8);
        }
        GgufValue::Str(s) => {
            ty(out, 8);
            string(out, s);
        }
        GgufValue::Array(items) => {
            ty(out, 9);
            let inner = match items.first() {
                Some(GgufValue::U64(_)) => 4u32,
                Some(GgufValue::I64(_)) => 5,
                Some(GgufValue::F64(_)) => 6,
                Some(GgufValue::Bool(_)) => 7,
                Some(GgufValue::Array(_)) => 9,
                _ => 8,
            };
            out.extend(inner.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for i in items {
                value(out, i, false);
            }
        }
    }
}

/// Serialises a GGUF v3 file (integers as u32/i32, floats as f32, alignment 32). Streams tensor
/// data into `sink` so large models need not fit in memory twice.
pub fn write(
    sink: &mut impl std::io::Write,
    metadata: &[(String, GgufValue)],
    tensors: &[TensorHeader],
    mut data: impl FnMut(usize) -> Vec<u8>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    head.extend(b"GGUF");
    head.extend(3u32.to_le_bytes());
    head.extend((tensors.len() as u64).to_le_bytes());
    head.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        string(&mut head, k);
        value(&mut head, v, true);
    }
    let mut offset = 0usize;
    for t in tensors {
        string(&mut head, &t.name);
        head.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            head.extend((*d as u64).to_le_bytes());
        }
        head.extend(t.ggml_type.to_le_bytes());
        head.extend((offset as u64).to_le_bytes());
        offset = (offset + t.len).next_multiple_of(32);
    }
    head.resize(head.len().next_multiple_of(32), 0);
    sink.write_all(&head)?;
    for (i, t) in tensors.iter().enumerate() {
        let bytes = data(i);
        if bytes.len() != t.len {
            return Err(std::io::Error::other(format!(
                "tensor {}: {} bytes, header says {}",
                t.name,
                bytes.len(),
                t.len
            )));
        }
        sink.write_all(&bytes)?;
        sink.write_all(&vec![0u8; t.len.next_multiple_of(32) - t.len])?;
    }
    Ok(())
}
