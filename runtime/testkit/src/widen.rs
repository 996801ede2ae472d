//! A GGUF file with its quantized tensors widened to f16 (or f32): the same weights, dequantized by
//! candle's GGML dequantizer (exact) and rounded to f16 (to nearest even), so the engine runs them on
//! its float path with full-precision activations instead of 8-bit ones. The sample deployment of
//! `make up` serves SmolLM2-135M-Instruct's Q4_1 weights widened so: on the integer path, the 8-bit
//! activations flip this small model's greedy answer to "What is the capital of France?" (llama.cpp
//! gives the same wrong answer on the Q4_1 file, and "Paris" on the widened one, as the engine does).
//!
//! Invariants: f32 tensors (norms, routers) are kept as they are; the output is a pure function of the
//! input (tensors and metadata written in name order), so its digest is stable; `general.file_type`
//! is rewritten to say what the file now holds.

use candle_core::Device;
use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use std::path::Path;

/// `llama_ftype` values of `general.file_type`.
const FTYPE_ALL_F32: u32 = 0;
const FTYPE_MOSTLY_F16: u32 = 1;

/// What to widen to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WidenTo {
    F16,
    F32,
}

/// Writes `src` with every quantized (or other non-f32) tensor stored as `to` to `dst`.
pub fn widen_gguf(src: &Path, dst: &Path, to: WidenTo) -> Result<(), String> {
    let (dtype, ftype) = match to {
        WidenTo::F16 => (GgmlDType::F16, FTYPE_MOSTLY_F16),
        WidenTo::F32 => (GgmlDType::F32, FTYPE_ALL_F32),
    };
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("{}: {what}: {e}", src.display());
    let mut file = std::fs::File::open(src).map_err(|e| fail("open", &e))?;
    let content = gguf_file::Content::read(&mut file).map_err(|e| fail("not a GGUF file", &e))?;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len());
    for name in names {
        let q = content
            .tensor(&mut file, name, &Device::Cpu)
            .map_err(|e| fail(name, &e))?;
        let q = if q.dtype() == GgmlDType::F32 || q.dtype() == dtype {
            q
        } else {
            let t = q.dequantize(&Device::Cpu).map_err(|e| fail(name, &e))?;
            QTensor::quantize(&t, dtype).map_err(|e| fail(name, &e))?
        };
        tensors.push((name.clone(), q));
    }
    let file_type = gguf_file::Value::U32(ftype);
    let mut metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| match k.as_str() {
            "general.file_type" => (k.as_str(), &file_type),
            _ => (k.as_str(), v),
        })
        .collect();
    metadata.sort_by(|a, b| a.0.cmp(b.0));
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let out = std::fs::File::create(dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    let mut out = std::io::BufWriter::new(out);
    gguf_file::write(&mut out, &metadata, &refs).map_err(|e| format!("{}: {e}", dst.display()))?;
    std::io::Write::flush(&mut out).map_err(|e| format!("{}: {e}", dst.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen_model::{GenDType, GenFormat, GenModelOptions, Shape, gen_model};

    #[test]
    fn a_quantized_file_widens_to_the_same_values_reproducibly() {
        let dir = tempfile::tempdir().unwrap();
        let opts = GenModelOptions {
            shape: Shape::Tiny,
            seed: 7,
            dtype: GenDType::Q8_0,
            format: GenFormat::Gguf,
        };
        gen_model(dir.path(), &opts).unwrap();
        let src = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "gguf"))
            .unwrap();
        let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
        widen_gguf(&src, &a, WidenTo::F16).unwrap();
        widen_gguf(&src, &b, WidenTo::F16).unwrap();
        assert_eq!(
            std::fs::read(&a).unwrap(),
            std::fs::read(&b).unwrap(),
            "reproducible"
        );
        let read = |p: &Path| {
            let mut f = std::fs::File::open(p).unwrap();
            let c = gguf_file::Content::read(&mut f).unwrap();
            (c, f)
        };
        let ((qc, mut qf), (wc, mut wf)) = (read(&src), read(&a));
        for (name, info) in &qc.tensor_infos {
            let q = qc.tensor(&mut qf, name, &Device::Cpu).unwrap();
            let w = wc.tensor(&mut wf, name, &Device::Cpu).unwrap();
            let want = if info.ggml_dtype == GgmlDType::F32 {
                GgmlDType::F32
            } else {
                GgmlDType::F16
            };
            assert_eq!(w.dtype(), want, "{name}");
            let (q, w) = (
                q.dequantize(&Device::Cpu)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap(),
                w.dequantize(&Device::Cpu)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap(),
            );
            // Q8_0 values are f16 scales times small integers: f16 holds them to within its rounding.
            let worst = q
                .iter()
                .zip(&w)
                .map(|(x, y)| (x - y).abs() / x.abs().max(1e-3))
                .fold(0.0, f32::max);
            assert!(worst < 1e-3, "{name}: {worst}");
        }
        let missing = widen_gguf(&a.with_extension("none"), &b, WidenTo::F16).unwrap_err();
        assert!(
            missing.contains("a.none") && missing.contains("open"),
            "{missing}"
        );
    }
}
