//! Compute kernels for the runtime engine: portable CPU versions (the default, tested everywhere) and
//! CUDA versions (`.cu` sources compiled at run time through NVRTC with `cudarc`, behind a `cuda`
//! feature) that must agree with the CPU versions.
//!
//! Empty until the engine issue (Engine I) lands its forward pass; the crate exists so the workspace has
//! the layout of `DESIGN.md` and the dependency direction engine → kernels is fixed from the start.
