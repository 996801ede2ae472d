//! Test models for the engine's and the runtime's tests, demos and benchmarks: weights are random,
//! shapes are real, and the output is a pure function of its options (byte-identical across runs and
//! machines, so digests of generated models are stable).
//!
//! - [`gen_model`]: random-weight Llama-family models of real shapes in Hugging Face layout, or one
//!   GGUF file (optionally quantized); `modelfleet-runtime gen-model` is its command line.
//! - [`gen_adapter`]: random PEFT LoRA adapters whose shapes come from a base model;
//!   `modelfleet-runtime gen-adapter` is its command line.
//! - [`fixtures`]: the real SmolLM2 weights' path and the structured-output tests' schema.
//! - [`widen`]: a quantized GGUF file's tensors widened to f16 (`modelfleet-runtime widen`; the
//!   sample deployment of `make up`).

pub mod fixtures;
pub mod gen_adapter;
pub mod gen_model;
pub mod widen;
