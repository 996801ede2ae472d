//! The local Kubernetes harness of modelfleet's end-to-end tests (e2e/README.md).
//!
//! - [`forward`]: `mf-forward`, TCP forwards from the host's loopback into the network namespace the
//!   real node runs in.
//!
//! Nothing here is used by the product crates; the binary in `src/bin` is a thin wrapper.

pub mod forward;
