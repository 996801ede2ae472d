#!/usr/bin/env bash
# Builds the pinned Kubernetes control-plane binaries (kube-apiserver, kube-controller-manager, kubectl),
# etcd, Prometheus and Helm from their official Go modules, into a cache keyed by version, outside the checkout.
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every staging module with ./staging/...
# and requires them at v0.0.0. We build from a throw-away wrapper module that requires k8s.io/kubernetes
# and replaces each staging module (read from that release's own go.mod) with the matching v0.x.y.
# etcd's server module is built the same way. Skips whatever is already in the cache.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"

export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
BIN="$MF_K8S_BIN"
mkdir -p "$BIN"
WORK="$MF_CACHE/build"
mkdir -p "$WORK"

log() { echo "[build-k8s $(date +%T)] $*" >&2; }

build_kubernetes() {
  local want=()
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
    [ -x "$BIN/$b" ] || want+=("$b")
  done
  [ ${#want[@]} -eq 0 ] && { log "kubernetes $K8S_VERSION: cached"; return; }
  local w="$WORK/kubernetes-$K8S_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -f "$gomod" ] || { log "cannot download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
  local staging_ver="v0.${K8S_VERSION#v1.}"
  {
    echo "module modelfleet.local/k8sbuild"
    echo
    echo "go 1.25.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" \
      | awk -v v="$staging_ver" '{print "replace " $1 " => " $1 " " v}'
  } > go.mod
  log "kubernetes $K8S_VERSION: $(grep -c '^replace' go.mod) staging modules replaced with $staging_ver"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local date; date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ld=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$date -X $p.gitCommit=0000000000000000000000000000000000000000"
  done
  for b in "${want[@]}"; do
    log "building $b ..."
    go build -trimpath -ldflags "-s -w $ld" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b"
    mv "$BIN/$b.tmp" "$BIN/$b"
  done
}

build_etcd() {
  [ -x "$BIN/etcd" ] && { log "etcd $ETCD_VERSION: cached"; return; }
  local w="$WORK/etcd-$ETCD_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  printf 'module modelfleet.local/etcdbuild\n\ngo 1.25.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > go.mod
  log "building etcd $ETCD_VERSION ..."
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

build_helm() {
  [ -x "$BIN/helm" ] && { log "helm $HELM_VERSION: cached"; return; }
  local w="$WORK/helm-$HELM_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  GOBIN="$w/bin" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$w/bin/helm" "$BIN/helm"
}

# Debian's prometheus package is built without Kubernetes service discovery (client-go is not packaged
# there), so Prometheus comes from its Go module too. The web UI's assets are not part of the module:
# the HTTP API (what the autoscaler and the tests use) works; the UI pages do not.
build_prometheus() {
  [ -x "$BIN/prometheus" ] && { log "prometheus $PROMETHEUS_VERSION: cached"; return; }
  local w="$WORK/prometheus-$PROMETHEUS_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  local v="github.com/prometheus/common/version"
  log "building prometheus $PROMETHEUS_VERSION (module $PROMETHEUS_MODULE_VERSION) ..."
  GOBIN="$w/bin" go install -trimpath \
    -ldflags "-s -w -X $v.Version=${PROMETHEUS_VERSION#v} -X $v.Branch=release -X $v.Revision=module" \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_MODULE_VERSION"
  mv "$w/bin/prometheus" "$BIN/prometheus"
}

# containerd 2.x and its runc shim, from the module (Debian's 1.6 lacks the RuntimeConfig RPC the 1.35
# kubelet asks for, and 1.35 is the last release to support 1.x). Static: no btrfs/devmapper/zfs snapshotters.
build_containerd() {
  local want=()
  for b in containerd containerd-shim-runc-v2 ctr; do
    [ -x "$MF_NODE_BIN/$b" ] || want+=("$b")
  done
  [ ${#want[@]} -eq 0 ] && { log "containerd $CONTAINERD_VERSION: cached"; return; }
  mkdir -p "$MF_NODE_BIN"
  local w="$WORK/containerd-$CONTAINERD_VERSION"
  rm -rf "$w"; mkdir -p "$w"
  local v="github.com/containerd/containerd/v2/version"
  for b in "${want[@]}"; do
    log "building $b $CONTAINERD_VERSION ..."
    GOBIN="$w/bin" go install -trimpath -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X $v.Version=$CONTAINERD_VERSION -X $v.Revision=module" \
      "github.com/containerd/containerd/v2/cmd/$b@$CONTAINERD_VERSION"
    mv "$w/bin/$b" "$MF_NODE_BIN/$b"
  done
}

what=${1:-all}
case "$what" in
  kubernetes) build_kubernetes ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  prometheus) build_prometheus ;;
  containerd) build_containerd ;;
  all) build_etcd; build_kubernetes; build_prometheus; build_helm; build_containerd ;;
  *) echo "usage: $0 [all|kubernetes|etcd|prometheus|helm|containerd]" >&2; exit 2 ;;
esac
log "binaries in $BIN"
