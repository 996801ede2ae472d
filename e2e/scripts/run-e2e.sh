#!/usr/bin/env bash
# Runs the end-to-end suite: brings the local cluster up (unless MF_E2E_KEEP_CLUSTER=1 and it already
# runs), runs every e2e scenario against it, and tears it down again, also on failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

keep=${MF_E2E_KEEP_CLUSTER:-0}
results=$(mktemp)
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "[e2e] failed; component logs follow" >&2
    e2e/cluster logs >&2 || true
    # The failing scenarios' own output and panic messages last, where a truncated log still shows them.
    if grep -q '^failures:' "$results"; then
      echo "[e2e] the failing scenarios' output again:" >&2
      sed -n '/^failures:/,$p' "$results" >&2
    fi
  fi
  rm -f "$results"
  [ "$keep" = 1 ] || e2e/cluster down || true
  exit $rc
}
trap cleanup EXIT

e2e/cluster up
eval "$(e2e/cluster env)"
# The node pulls our images from the cluster's registry, by the digests the push prints into
# dist/helm-values.yaml (the chart values the scenarios install with).
bash e2e/scripts/push-images.sh
# --workspace keeps the feature set of `cargo test --workspace`, so nothing is rebuilt; the e2e scenarios
# are the ignored tests of e2e/tests/*.rs, run inside the cluster's network (e2e/cluster exec), where pod
# IPs and ClusterIPs are reachable.
targets=()
for f in e2e/tests/*.rs; do targets+=(--test "$(basename "$f" .rs)"); done
cargo test --workspace "${targets[@]}" --no-run
e2e/cluster exec -- cargo test --workspace "${targets[@]}" -- --ignored --test-threads=4 2>&1 | tee "$results"
