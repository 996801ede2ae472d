//! The local Kubernetes harness of modelfleet's end-to-end tests.
//!
//! - [`kubelet`]: `mf-kubelet`, a process kubelet that registers a Node, binds pending pods to it and
//!   runs their containers as local processes on their own 127.x addresses, against a real
//!   kube-apiserver and kube-controller-manager.
//!
//! Nothing here is used by the product crates; the binaries in `src/bin` are thin wrappers.

pub mod kubelet;
