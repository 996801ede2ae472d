#!/usr/bin/env bash
# Runs the end-to-end suite: brings the local cluster up (unless MF_E2E_KEEP_CLUSTER=1 and it already
# runs), runs every e2e scenario against it, and tears it down again, also on failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

keep=${MF_E2E_KEEP_CLUSTER:-0}
results=$(mktemp)
outs=$(mktemp -d)
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
  rm -rf "$results" "$outs"
  [ "$keep" = 1 ] || e2e/cluster down || true
  exit $rc
}
trap cleanup EXIT

e2e/cluster up
eval "$(e2e/cluster env)"
# The node pulls our images from the cluster's registry, by the digests the push prints into
# dist/helm-values.yaml (the chart values the scenarios install with).
bash e2e/scripts/push-images.sh
# --workspace keeps the feature set of `cargo test --workspace`, so nothing is rebuilt. The e2e scenarios
# are the ignored tests of e2e/tests/*.rs, run inside the cluster's network (e2e/cluster exec), where pod
# IPs and ClusterIPs are reachable. The test binaries are run directly (as cargo would: from e2e/, with
# --ignored), not through `cargo test`, which holds the build directory's lock while tests run.
declare -A bin=()
while IFS=$'\t' read -r name path; do bin[$name]=$path; done < <(
  cargo test --workspace --tests --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-message":
        print(m["message"]["rendered"], end="", file=sys.stderr)
    elif m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in t.get("kind", []) \
            and t.get("src_path", "").startswith("'"$PWD"'/e2e/tests/"):
        print(t["name"], m["executable"], sep="\t")')

# Scenarios that change what every other one shares (they kill the operator's leader, restart the API
# server, change the gateway's replicas through helm, taint the node) or that size replicas by the CPU
# they measure, or count status writes under steady load, or need no keyless ModelDeployment anywhere in
# the cluster for a while (gateway: an unknown key is a 401 before the body only then — lane A's
# scenarios keep keyless ones up back to back), run alone; the rest run in two lanes side by
# side (they wait on pods far more than they compute; the lanes about even, 270 and 380 s here). A
# scenario this list does not name runs alone, at the end.
alone_first=(autoscaling)
lane_a=(rollout rollout_affinity crds images families traces fallback)
lane_b=(delivery capacity gateway_affinity lora poison node)
alone_last=(gateway serving operator limits placement chaos)
listed=" ${alone_first[*]} ${lane_a[*]} ${lane_b[*]} ${alone_last[*]} "
for f in e2e/tests/*.rs; do
  name=$(basename "$f" .rs)
  [ -n "${bin[$name]:-}" ] || { echo "[e2e] no test binary for $f" >&2; exit 1; }
  [[ $listed == *" $name "* ]] || alone_last+=("$name")
done

# One scenario binary, its output kept whole in $results once it ends; its time in the log.
scenario() {
  local name=$1 began=$SECONDS rc=0
  (cd e2e && ../e2e/cluster exec -- "${bin[$name]}" --ignored --test-threads=4) >"$outs/$name" 2>&1 || rc=$?
  {
    flock 9
    { echo "     Running tests/$name.rs"; cat "$outs/$name"
      echo "[e2e] $name: $([ $rc = 0 ] && echo passed || echo "FAILED ($rc)") in $((SECONDS - began)) s"
    } | tee -a "$results"
  } 9>"$outs/.lock"
  return $rc
}
lane() {
  local rc=0 name
  for name in "$@"; do scenario "$name" || rc=1; done
  return $rc
}
failed=0
lane "${alone_first[@]}" || failed=1
lane "${lane_a[@]}" & a=$!
lane "${lane_b[@]}" & b=$!
wait $a || failed=1
wait $b || failed=1
lane "${alone_last[@]}" || failed=1
echo "[e2e] every scenario in $SECONDS s since the suite began" >&2
exit $failed
