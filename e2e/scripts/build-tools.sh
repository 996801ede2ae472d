#!/usr/bin/env bash
# Builds the real peers the model-delivery scenarios run against, from their Go modules, into a cache
# keyed by version (outside the checkout):
#   - versitygw: an S3 server (Apache-2.0; a plain directory backend; checks SigV4 signatures), which
#     e2e/tests/delivery.rs runs as a pod in the local cluster from an image built on our base;
#   - cosign: signs model artifacts with a key pair, offline (--tlog-upload=false), as a user would.
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

what=${1:-all}
case "$what" in
  versitygw) install_cmd versitygw github.com/versity/versitygw/cmd/versitygw "$VERSITYGW_VERSION" ;;
  cosign) install_cmd cosign github.com/sigstore/cosign/v2/cmd/cosign "$COSIGN_VERSION" ;;
  all)
    install_cmd versitygw github.com/versity/versitygw/cmd/versitygw "$VERSITYGW_VERSION"
    install_cmd cosign github.com/sigstore/cosign/v2/cmd/cosign "$COSIGN_VERSION"
    ;;
  *) echo "usage: $0 [all|versitygw|cosign]" >&2; exit 2 ;;
esac
log "binaries in $BIN"
