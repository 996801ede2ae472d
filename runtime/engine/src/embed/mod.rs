//! Embedding models: an encoder (BERT family: the real all-MiniLM-L6-v2 first) that turns a batch of
//! inputs into one vector each — pooled and normalised as the model's sentence-transformers files say
//! (`config`) — for `POST /v1/embeddings`.
//!
//! Tour: [`config`] (what the files say, checked), `bert` (the forward pass on the kernels),
//! [`EmbedModel`] (the files opened together), [`Embedder`] (loaded on a backend: tokenize, embed).
//!
//! Invariants: an input's embedding is bit-identical alone or in any batch (the encoder's rows depend
//! on their own input only; pooling reduces in row order); pooling and normalisation run in f32 in a
//! fixed order; nothing panics on bad input — lengths and ids are checked and refused naming `input`.

mod bert;
pub mod config;

pub use bert::Encoder;
pub use config::{EmbedConfig, Pooling, is_encoder};

use crate::error::{EngineError, Result};
use crate::model::Weights;
use crate::tokenizer::Tokenizer;
use modelfleet_kernels::Kernels;
use std::path::{Path, PathBuf};

/// An embedding model's files, opened and checked (weights mapped, not uploaded).
pub struct EmbedModel {
    /// The directory.
    pub path: PathBuf,
    /// Its configuration.
    pub config: EmbedConfig,
    /// `tokenizer.json` (its own padding and truncation switched off: inputs are neither).
    pub tokenizer: Tokenizer,
    weights: Weights,
}

impl EmbedModel {
    /// Opens the model directory `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let config = EmbedConfig::open(dir)?;
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let weights = Weights::open(dir)?;
        Ok(Self {
            path: dir.to_path_buf(),
            config,
            tokenizer,
            weights,
        })
    }

    /// Bytes of the weights as stored (what loading them costs in memory).
    pub fn weight_bytes(&self) -> u64 {
        self.weights.stored_bytes().iter().map(|(_, b)| b).sum()
    }
}

/// An embedding model loaded on a kernels backend.
pub struct Embedder<K: Kernels> {
    kernels: K,
    encoder: Encoder<K>,
    /// The model's configuration.
    pub config: EmbedConfig,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Where it was loaded from.
    pub path: PathBuf,
}

impl<K: Kernels> Embedder<K> {
    /// Uploads the model's weights to `kernels`.
    pub fn load(m: EmbedModel, kernels: K) -> Result<Self> {
        let encoder = Encoder::load(&m.config.encoder, &m.weights, &kernels)?;
        Ok(Self {
            kernels,
            encoder,
            config: m.config,
            tokenizer: m.tokenizer,
            path: m.path,
        })
    }

    /// Elements of each embedding.
    pub fn dimensions(&self) -> usize {
        self.config.encoder.hidden_size
    }

    /// The token ids of `text` with the model's special tokens (`[CLS] … [SEP]`).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(text, true)
    }

    /// One embedding per input (token ids, each 1 to [`EmbedConfig::max_input_tokens`] long), pooled
    /// and — if the model says so — normalised.
    pub fn embed(&self, inputs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let max = self.config.max_input_tokens;
        if let Some((i, s)) = inputs.iter().enumerate().find(|(_, s)| s.len() > max) {
            return Err(EngineError::InvalidParam {
                field: "input",
                message: format!("item {i} has {} tokens; this model takes at most {max}", s.len()),
            });
        }
        let h = self.dimensions();
        let states = self.encoder.forward(&self.kernels, inputs)?;
        let mut start = 0;
        Ok(inputs
            .iter()
            .map(|s| {
                let rows = &states[start * h..(start + s.len()) * h];
                start += s.len();
                let mut v = pool(self.config.pooling, rows, h);
                if self.config.normalize {
                    normalize(&mut v);
                }
                v
            })
            .collect())
    }

    /// Checks a request's `dimensions`: the full size always, a smaller one only where the model was
    /// trained for Matryoshka truncation (`matryoshka_dimensions` in its `config.json`).
    pub fn check_dimensions(&self, want: usize) -> Result<()> {
        let full = self.dimensions();
        if want == full {
            return Ok(());
        }
        match &self.config.encoder.matryoshka_dimensions {
            Some(dims) if dims.contains(&want) => Ok(()),
            Some(dims) => Err(EngineError::InvalidParam {
                field: "dimensions",
                message: format!("{want} is not one of this model's dimensions {dims:?} or {full}"),
            }),
            None => Err(EngineError::InvalidParam {
                field: "dimensions",
                message: format!(
                    "this model does not support truncated embeddings: omit `dimensions` or give {full}"
                ),
            }),
        }
    }

    /// `v` cut to its first `dims` elements (Matryoshka), normalised again if the model normalises.
    pub fn truncate(&self, v: &mut Vec<f32>, dims: usize) {
        if dims < v.len() {
            v.truncate(dims);
            if self.config.normalize {
                normalize(v);
            }
        }
    }
}

/// One vector from a sequence's `rows × h` states.
fn pool(p: Pooling, rows: &[f32], h: usize) -> Vec<f32> {
    let n = rows.len() / h;
    let sum = || {
        let mut acc = vec![0.0f32; h];
        for r in rows.chunks_exact(h) {
            acc.iter_mut().zip(r).for_each(|(a, x)| *a += x);
        }
        acc
    };
    match p {
        Pooling::Cls => rows[..h].to_vec(),
        Pooling::LastToken => rows[(n - 1) * h..].to_vec(),
        Pooling::Mean => sum().into_iter().map(|x| x / n as f32).collect(),
        Pooling::MeanSqrtLen => sum().into_iter().map(|x| x / (n as f32).sqrt()).collect(),
        Pooling::Max => {
            let mut m = rows[..h].to_vec();
            for r in rows.chunks_exact(h).skip(1) {
                m.iter_mut().zip(r).for_each(|(a, &x)| *a = a.max(x));
            }
            m
        }
    }
}

/// Scales `v` to unit length (PyTorch's `normalize`: divided by `max(‖v‖, 1e-12)`).
fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt() as f32;
    let inv = 1.0 / norm.max(1e-12);
    v.iter_mut().for_each(|x| *x *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_modes() {
        let rows = [1.0f32, 2.0, 3.0, -4.0, 5.0, 0.0];
        assert_eq!(pool(Pooling::Cls, &rows, 2), vec![1.0, 2.0]);
        assert_eq!(pool(Pooling::LastToken, &rows, 2), vec![5.0, 0.0]);
        assert_eq!(pool(Pooling::Mean, &rows, 2), vec![3.0, -2.0 / 3.0]);
        assert_eq!(pool(Pooling::Max, &rows, 2), vec![5.0, 2.0]);
        let s = pool(Pooling::MeanSqrtLen, &rows, 2);
        assert!((s[0] - 9.0 / 3f32.sqrt()).abs() < 1e-6);
        let mut v = vec![3.0f32, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0f32; 3];
        normalize(&mut z);
        assert_eq!(z, vec![0.0; 3]);
    }
}
