#!/usr/bin/env bash
# `make up`: the local control plane, the modelfleet CRDs, and the operator installed with its Helm chart
# (running as pods through the process kubelet). Prints how to use it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

e2e/cluster up
eval "$(e2e/cluster env)"
kubectl apply --server-side -f crds/ >/dev/null
helm upgrade --install modelfleet charts/modelfleet --namespace modelfleet-system --create-namespace \
  --set image.tag=dev --set runtimeImage=modelfleet/runtime:dev \
  --set "modelCache.hostPath=$MF_CLUSTER_DIR/model-cache" --wait --timeout 120s >/dev/null
kubectl get pods -n modelfleet-system

cat <<MSG

modelfleet is up: Kubernetes $(kubectl version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1) on loopback, the operator in namespace modelfleet-system.

  eval "\$(e2e/cluster env)"      # KUBECONFIG, kubectl and helm on PATH, MF_PROMETHEUS_URL
  kubectl get md,lora -A          # ModelDeployments and LoraAdapters
  kubectl get lease -n modelfleet-system modelfleet-operator   # the operator's leader
  curl -s "\$MF_PROMETHEUS_URL/api/v1/targets" | head -c 300  # what Prometheus scrapes
  make down                       # stop everything

Serving a sample model (SmolLM2-135M-Instruct) joins this command when the runtime's \`serve\` lands.
MSG
