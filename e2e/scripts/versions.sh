# Pinned versions of everything the local control plane is built from, and where the builds are cached.
# Sourced by the e2e scripts; bumping a version here rebuilds into a new cache directory.
K8S_VERSION=v1.35.4
ETCD_VERSION=v3.6.16
HELM_VERSION=v3.19.5
# Prometheus v3.16.0 is published as Go module version v0.316.0.
PROMETHEUS_VERSION=v3.16.0
PROMETHEUS_MODULE_VERSION=v0.316.0
# The real node (e2e/cluster): containerd from its Go module; runc and the CNI plugins from Debian.
CONTAINERD_VERSION=v2.4.2
MF_CACHE=${MODELFLEET_CACHE:-$HOME/.cache/modelfleet}
MF_K8S_BIN="$MF_CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-prometheus-$PROMETHEUS_VERSION-helm-$HELM_VERSION/bin"
MF_NODE_BIN="$MF_CACHE/node-containerd-$CONTAINERD_VERSION/bin"
# Peers the delivery scenarios use (e2e/scripts/build-tools.sh): an S3 server (versitygw, Apache-2.0;
# checks SigV4) run as a pod in the cluster, and cosign (signs model artifacts offline).
VERSITYGW_VERSION=v1.8.0
COSIGN_VERSION=v2.6.5
MF_TOOLS_BIN="$MF_CACHE/tools-versitygw-$VERSITYGW_VERSION-cosign-$COSIGN_VERSION/bin"
# The trace backend the tracing scenario checks our OTLP exports against: Jaeger v2 (Apache-2.0; the
# OpenTelemetry-collector-based all-in-one, in-memory store), built from its Go module and run as a pod.
# Its own cache directory, so bumping it never rebuilds versitygw or cosign.
JAEGER_VERSION=v1.75.0
MF_JAEGER_BIN="$MF_CACHE/tools-jaeger-$JAEGER_VERSION/bin"
