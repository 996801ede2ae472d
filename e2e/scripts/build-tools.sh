#!/usr/bin/env bash
# Builds the real peers the model-delivery scenarios run against, from their Go modules, into a cache
# keyed by version (outside the checkout):
#   - versitygw: an S3 server (Apache-2.0; a plain directory backend; checks SigV4 signatures), which
#     e2e/tests/delivery.rs runs as a pod in the local cluster from an image built on our base;
#   - cosign: signs model artifacts with a key pair, offline (--tlog-upload=false), as a user would;
#   - jaeger: the trace backend (Jaeger v2, Apache-2.0: all-in-one, in-memory store) the tracing scenario
#     runs as a pod, from an image built on our base, and reads our OTLP exports back from
#     ($MF_JAEGER_BIN, a cache directory of its own).
# Static binaries (CGO off). Skips whatever is already in the cache.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"

export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
BIN="$MF_TOOLS_BIN"
mkdir -p "$BIN"
WORK="$MF_CACHE/build"
mkdir -p "$WORK"

log() { echo "[build-tools $(date +%T)] $*" >&2; }

# go install <module>/cmd/<name>@<version> into $BIN.
install_cmd() {
  local name=$1 pkg=$2 version=$3
  [ -x "$BIN/$name" ] && { log "$name $version: cached"; return; }
  local w="$WORK/$name-$version"
  rm -rf "$w"; mkdir -p "$w"
  log "building $name $version ..."
  GOBIN="$w/bin" go install -trimpath -ldflags "-s -w" "$pkg@$version"
  mv "$w/bin/$name" "$BIN/$name"
  rm -rf "$w"
}

# Jaeger's go.mod has a replace directive, so `go install <module>/cmd/jaeger@<version>` refuses it: the
# module is downloaded from the proxy and built from a writable copy, as its own go.mod pins it.
build_jaeger() {
  local version=$JAEGER_VERSION bin="$MF_JAEGER_BIN"
  mkdir -p "$bin"
  [ -x "$bin/jaeger" ] && { log "jaeger $version: cached"; return; }
  local w="$WORK/jaeger-$version" dir
  rm -rf "$w"; mkdir -p "$w"
  log "building jaeger $version (a few minutes) ..."
  dir=$(go mod download -json "github.com/jaegertracing/jaeger@$version" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  cp -r "$dir" "$w/src"
  chmod -R u+w "$w/src"
  (cd "$w/src" && go build -trimpath -ldflags "-s -w" -o "$w/jaeger" ./cmd/jaeger)
  mv "$w/jaeger" "$bin/jaeger"
  rm -rf "$w"
}

what=${1:-all}
case "$what" in
  versitygw) install_cmd versitygw github.com/versity/versitygw/cmd/versitygw "$VERSITYGW_VERSION" ;;
  cosign) install_cmd cosign github.com/sigstore/cosign/v2/cmd/cosign "$COSIGN_VERSION" ;;
  jaeger) build_jaeger ;;
  all)
    install_cmd versitygw github.com/versity/versitygw/cmd/versitygw "$VERSITYGW_VERSION"
    install_cmd cosign github.com/sigstore/cosign/v2/cmd/cosign "$COSIGN_VERSION"
    build_jaeger
    ;;
  *) echo "usage: $0 [all|versitygw|cosign|jaeger]" >&2; exit 2 ;;
esac
log "binaries in $BIN and $MF_JAEGER_BIN"
