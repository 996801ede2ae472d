//! Memory-mapped weights by Hugging Face tensor name: a single `model.safetensors`, a sharded set
//! described by `model.safetensors.index.json`, every `*.safetensors` file in the directory, or a GGUF
//! file (see [`super::gguf`], which maps llama.cpp's tensor names to these).
//!
//! Invariants: files are mapped read-only and never copied (aligned tensors are used in place — the
//! page cache is the only copy, shared by every process serving the same files); f32, f16 and bf16 are
//! accepted, other dtypes are refused naming the tensor and file; a tensor's byte range is checked
//! against its header shape before use. Mapping is `unsafe` in `memmap2` because another process could
//! truncate the file underneath us: model files are immutable artifacts verified by digest
//! (docs/design.md, "Canonical digest"), which is the contract that makes this sound in practice.

use crate::error::{EngineError, Result, parse_json, read_to_string};
use modelfleet_kernels::{ByteSource, DType, HostWeight};
use safetensors::tensor::{Dtype, SafeTensors, TensorInfo};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A read-only memory map of one file.
pub(crate) struct Mapped(pub(crate) memmap2::Mmap);

impl Mapped {
    /// Maps `path` read-only.
    pub(crate) fn open(path: &Path) -> Result<Arc<Self>> {
        let io = |source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: see the module header — model files are immutable while served.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(Arc::new(Mapped(map)))
    }
}

impl ByteSource for Mapped {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// One opened weight file.
struct File {
    path: PathBuf,
    map: Arc<Mapped>,
}

/// Where one tensor lives.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Index into `files`.
    file: usize,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
    /// The dtype, or why it is unsupported (reported only if the tensor is used).
    dtype: std::result::Result<DType, String>,
    /// Shape in Hugging Face order (outermost first).
    shape: Vec<usize>,
}

/// Every tensor of a model, by Hugging Face name.
pub struct Weights {
    dir: PathBuf,
    files: Vec<File>,
    tensors: HashMap<String, Entry>,
    /// Set by [`Weights::release_maps`].
    released: bool,
}

impl Weights {
    /// Opens the safetensors files of the model directory `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let paths = if index.exists() {
            #[derive(serde::Deserialize)]
            struct Index {
                weight_map: BTreeMap<String, String>,
            }
            let idx: Index = parse_json(&index, &read_to_string(&index)?)?;
            let mut files: Vec<String> = idx.weight_map.into_values().collect();
            files.sort();
            files.dedup();
            for f in &files {
                if f.contains('/') || f.contains('\\') || f == ".." {
                    return Err(EngineError::Config {
                        path: index.clone(),
                        field: "weight_map".into(),
                        message: format!("{f:?} is not a file name in the model directory"),
                    });
                }
            }
            files.into_iter().map(|f| dir.join(f)).collect()
        } else if single.exists() {
            vec![single]
        } else {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|source| EngineError::Io {
                    path: dir.to_path_buf(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(EngineError::Weights {
                    path: dir.to_path_buf(),
                    tensor: "*".into(),
                    message: "no model.safetensors, model.safetensors.index.json or *.safetensors file"
                        .into(),
                });
            }
            found
        };
        let mut weights = Weights {
            dir: dir.to_path_buf(),
            files: Vec::new(),
            tensors: HashMap::new(),
            released: false,
        };
        for path in paths {
            weights.add_file(path)?;
        }
        Ok(weights)
    }

    fn add_file(&mut self, path: PathBuf) -> Result<()> {
        let map = Mapped::open(&path)?;
        let (header_len, meta) = SafeTensors::read_metadata(&map.0).map_err(|e| EngineError::Weights {
            path: path.clone(),
            tensor: "*".into(),
            message: format!("not a valid safetensors file: {e}"),
        })?;
        let file = self.files.len();
        let data_start = 8 + header_len;
        for (name, info) in meta.tensors() {
            let entry = Entry {
                file,
                start: data_start + info.data_offsets.0,
                end: data_start + info.data_offsets.1,
                dtype: safetensors_dtype(info),
                shape: info.shape.clone(),
            };
            self.tensors.insert(name, entry);
        }
        self.files.push(File { path, map });
        Ok(())
    }

    /// Weights of one GGUF file whose tensors are already named and shaped the Hugging Face way.
    pub(crate) fn from_entries(path: &Path, map: Arc<Mapped>, tensors: Vec<(String, Entry)>) -> Self {
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let files = vec![File {
            path: path.to_path_buf(),
            map,
        }];
        Weights {
            dir,
            files,
            tensors: tensors.into_iter().collect(),
            released: false,
        }
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Tensor names (sorted).
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        v.sort();
        v
    }

    /// Bytes of every tensor as stored, by element type (`f32`, `f16`, `bf16`, a GGML format such as
    /// `q4_1`, or `unsupported` for tensors the engine cannot read), sorted by type. What `plan`
    /// reports and what a memory-sized KV pool subtracts for the weights (`kv::sizing`): packed copies
    /// keep the stored element type, and quantized weights are read in place.
    pub fn stored_bytes(&self) -> Vec<(String, u64)> {
        let mut by: BTreeMap<String, u64> = BTreeMap::new();
        for e in self.tensors.values() {
            let name = e
                .dtype
                .as_ref()
                .map_or("unsupported".to_string(), |d| d.to_string());
            *by.entry(name).or_default() += (e.end - e.start) as u64;
        }
        by.into_iter().collect()
    }

    /// Drops this table's hold on the mapped files once the engine holds its weights (packed copies, or
    /// its own handles on the maps for weights read in place), so each map lives exactly as long as
    /// some weight reads it: an f16 model whose matrices were all packed unmaps its file, instead of
    /// keeping the pages it touched while packing. Later [`Weights::get`] calls fail, saying so.
    pub fn release_maps(&mut self) {
        self.files.clear();
        self.tensors.clear();
        self.released = true;
    }

    /// The tensor `name`, checked to have exactly `shape` (a vector is `[n]`, a matrix `[rows, cols]`).
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<HostWeight> {
        let Some(entry) = self.tensors.get(name) else {
            let message = if self.released {
                "the weight files were released after the model was loaded"
            } else {
                "missing from every weight file"
            };
            return Err(EngineError::Weights {
                path: self.dir.clone(),
                tensor: name.into(),
                message: message.into(),
            });
        };
        let file = &self.files[entry.file];
        let err = |message: String| EngineError::Weights {
            path: file.path.clone(),
            tensor: name.into(),
            message,
        };
        if entry.shape != shape {
            return Err(err(format!("shape {:?}, expected {:?}", entry.shape, shape)));
        }
        let dtype = entry.dtype.clone().map_err(err)?;
        let (rows, cols) = match shape {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            _ => return Err(err(format!("rank {} is not supported", shape.len()))),
        };
        let source: Arc<dyn ByteSource> = file.map.clone();
        HostWeight::new(source, entry.start, entry.end, dtype, rows, cols).map_err(|e| err(e.to_string()))
    }
}

impl Weights {
    /// The `n` experts' `[rows, cols]` matrices of one projection: `per_expert(e)` each as stored in
    /// safetensors (`…mlp.experts.E.gate_proj.weight`), or the slices of the one `[n, rows, cols]`
    /// tensor `stacked` that GGUF files hold (`ffn_gate_exps`), each a view of its own bytes.
    pub fn get_experts(
        &self,
        stacked: &str,
        per_expert: impl Fn(usize) -> String,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<HostWeight>> {
        let Some(entry) = self.tensors.get(stacked) else {
            return (0..n).map(|e| self.get(&per_expert(e), &[rows, cols])).collect();
        };
        let file = &self.files[entry.file];
        let err = |message: String| EngineError::Weights {
            path: file.path.clone(),
            tensor: stacked.into(),
            message,
        };
        if entry.shape != [n, rows, cols] {
            return Err(err(format!(
                "shape {:?}, expected {:?}",
                entry.shape,
                [n, rows, cols]
            )));
        }
        let dtype = entry.dtype.clone().map_err(err)?;
        let row_bytes = dtype
            .row_bytes(cols)
            .ok_or_else(|| err(format!("{cols} columns are not whole {dtype} blocks")))?;
        let per = rows * row_bytes;
        if entry.end - entry.start != n * per {
            return Err(err(format!(
                "{} bytes, expected {} for {n} experts",
                entry.end - entry.start,
                n * per
            )));
        }
        (0..n)
            .map(|e| {
                let start = entry.start + e * per;
                let source: Arc<dyn ByteSource> = file.map.clone();
                HostWeight::new(source, start, start + per, dtype, rows, cols).map_err(|x| err(x.to_string()))
            })
            .collect()
    }
}

impl Weights {
    /// The `[parts[i], cols]` row blocks of the `[Σ parts, cols]` tensor `name`, in order, each a view
    /// of its own bytes: the fused projections of Phi-3 (`qkv_proj` → q, k, v; `gate_up_proj` → gate,
    /// up). Quantized rows are whole blocks, so any row range is a valid tensor.
    pub fn get_row_split(&self, name: &str, parts: &[usize], cols: usize) -> Result<Vec<HostWeight>> {
        let rows: usize = parts.iter().sum();
        let fused = self.get(name, &[rows, cols])?;
        let entry = &self.tensors[name];
        let file = &self.files[entry.file];
        let err = |message: String| EngineError::Weights {
            path: file.path.clone(),
            tensor: name.into(),
            message,
        };
        let dtype = fused.dtype();
        let row_bytes = dtype
            .row_bytes(cols)
            .ok_or_else(|| err(format!("{cols} columns are not whole {dtype} blocks")))?;
        let mut start = entry.start;
        parts
            .iter()
            .map(|&n| {
                let source: Arc<dyn ByteSource> = file.map.clone();
                let end = start + n * row_bytes;
                let w = HostWeight::new(source, start, end, dtype, n, cols).map_err(|x| err(x.to_string()));
                start = end;
                w
            })
            .collect()
    }
}

impl Entry {
    /// A tensor at `start..end` of the (single) file.
    pub(crate) fn new(
        start: usize,
        end: usize,
        dtype: std::result::Result<DType, String>,
        shape: Vec<usize>,
    ) -> Self {
        Entry {
            file: 0,
            start,
            end,
            dtype,
            shape,
        }
    }
}

fn safetensors_dtype(info: &TensorInfo) -> std::result::Result<DType, String> {
    match info.dtype {
        Dtype::F32 => Ok(DType::F32),
        Dtype::F16 => Ok(DType::F16),
        Dtype::BF16 => Ok(DType::BF16),
        other => Err(format!("dtype {other:?} is not supported (F32, F16, BF16)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    fn write(dir: &Path, file: &str, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, dt, shape, data)| (n.to_string(), TensorView::new(*dt, shape.clone(), data).unwrap()))
            .collect();
        std::fs::write(dir.join(file), safetensors::serialize(views, None).unwrap()).unwrap();
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn single_file_loads_f32_f16_bf16_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let h: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let b: Vec<u8> = [0.25f32, 4.0]
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        write(
            dir.path(),
            "model.safetensors",
            &[
                ("a", Dtype::F32, vec![2, 2], f32s(&[1.0, 2.0, 3.0, 4.0])),
                ("h", Dtype::F16, vec![2], h),
                ("b", Dtype::BF16, vec![1, 2], b),
            ],
        );
        let w = Weights::open(dir.path()).unwrap();
        let a = w.get("a", &[2, 2]).unwrap();
        assert_eq!((a.rows(), a.cols(), a.data().get(3)), (2, 2, 4.0));
        assert_eq!(w.get("h", &[2]).unwrap().data().get(0), 1.5);
        assert_eq!(w.get("b", &[1, 2]).unwrap().data().get(1), 4.0);
        assert_eq!(w.names(), vec!["a", "b", "h"]);
    }

    #[test]
    fn sharded_index_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "model-00001-of-00002.safetensors",
            &[("x", Dtype::F32, vec![1], f32s(&[7.0]))],
        );
        write(
            dir.path(),
            "model-00002-of-00002.safetensors",
            &[("y", Dtype::F32, vec![1], f32s(&[8.0]))],
        );
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            r#"{"metadata":{},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let mut w = Weights::open(dir.path()).unwrap();
        let y = w.get("y", &[1]).unwrap();
        assert_eq!(y.data().get(0), 8.0);
        // Released: the table lets go of the maps; a weight taken before keeps its own.
        w.release_maps();
        assert_eq!(y.data().get(0), 8.0);
        let err = w.get("x", &[1]).unwrap_err().to_string();
        assert!(err.contains("released after the model was loaded"), "{err}");
    }

    #[test]
    fn errors_name_file_and_tensor() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "model.safetensors",
            &[
                ("a", Dtype::F32, vec![2], f32s(&[1.0, 2.0])),
                ("i", Dtype::I32, vec![1], vec![0; 4]),
            ],
        );
        let w = Weights::open(dir.path()).unwrap();
        let msg = |r: Result<HostWeight>| r.unwrap_err().to_string();
        let shape = msg(w.get("a", &[3]));
        assert!(
            shape.contains("model.safetensors") && shape.contains("`a`") && shape.contains("[2]"),
            "{shape}"
        );
        assert!(msg(w.get("i", &[1])).contains("dtype I32"));
        assert!(msg(w.get("zz", &[1])).contains("`zz`: missing"));
        std::fs::write(dir.path().join("model.safetensors"), b"garbage").unwrap();
        let bad = Weights::open(dir.path()).err().unwrap().to_string();
        assert!(
            bad.contains("model.safetensors") && bad.contains("not a valid safetensors"),
            "{bad}"
        );
        let empty = tempfile::tempdir().unwrap();
        assert!(Weights::open(empty.path()).is_err());
    }
}
