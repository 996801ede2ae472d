#!/usr/bin/env bash
# Model delivery on the running local cluster (`make up`, or a cluster kept by MF_E2E_KEEP_CLUSTER=1 with
# the chart installed): e2e/examples/delivery_bench.rs, run inside the cluster's network.
#   bench/delivery.sh scale-out   # llama-3.2-1b q8_0 GGUF (~1.3 GB): 1 -> 4 replicas per source on the
#                                 # one node; each pod's creation -> Ready, pod 1 against pods 2-4, and
#                                 # how often the registry served each blob (its access log)
#   bench/delivery.sh ready       # llama-3.2-1b f32 safetensors (~4.9 GB): one pod per source (no node
#                                 # cache), its start split into node / pull / verify / install / load
# Figures: docs/benchmarks.md ("Model delivery"). Needs ~25 GB of free disk for `ready`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(e2e/cluster env)"
what=${1:?usage: bench/delivery.sh scale-out|ready}
cargo build --workspace --bins >/dev/null
cargo build --workspace --release --example delivery_bench >/dev/null
target=${CARGO_TARGET_DIR:-$PWD/target}
e2e/cluster exec -- env CARGO_TARGET_DIR="$target" "$target/release/examples/delivery_bench" "$what"
