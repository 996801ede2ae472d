//! The local Kubernetes harness and end-to-end helpers.
