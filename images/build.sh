#!/usr/bin/env bash
# `make dist`, `make images` and `make push`: the release binaries, then the base and the three images
# built from images/Containerfile with buildah — no container daemon, no public registry — and pushed by
# digest to $REGISTRY.
#
#   images/build.sh dist      release binaries of the three programs into dist/ (MODELFLEET_REVISION =
#                             the git commit, so `--version` names it)
#   images/build.sh images    dist, then localhost/modelfleet/base:bookworm (images/base),
#                             localhost/modelfleet/{operator,gateway,runtime}:$VERSION and the limits
#                             store localhost/modelfleet/store:$VERSION (images/store)
#   images/build.sh push      pushes those to $REGISTRY/modelfleet/<program>:$VERSION and prints the
#                             chart values that pin them by digest (also written to dist/helm-values.yaml)
#
# Images live in a containers-storage of their own (~/.cache/modelfleet/containers, vfs driver: works
# on any file system, nested overlays included), so nothing else on the machine is touched. A
# registry on 127.0.0.1 or localhost is spoken to over plain HTTP (the harness's loopback registry);
# any other over TLS, with the credentials `buildah login` stored.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$REVISION" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  REVISION="$REVISION-dirty"
fi
PROGRAMS=(operator gateway runtime)
BASE=localhost/modelfleet/base:bookworm
STORE=${MODELFLEET_IMAGE_STORE:-$HOME/.cache/modelfleet/containers}
TARGET_DIR=${CARGO_TARGET_DIR:-target}

log() { echo "[images $(date +%H:%M:%S)] $*" >&2; }
bah() { buildah --root "$STORE/storage" --runroot "$STORE/run" --storage-driver vfs "$@"; }

dist() {
  log "cargo build --release (revision $REVISION)"
  MODELFLEET_REVISION=$REVISION cargo build --release --locked --bins \
    -p modelfleet-operator -p modelfleet-gateway -p modelfleet-runtime
  mkdir -p dist
  for p in "${PROGRAMS[@]}"; do
    install -m 0555 "$TARGET_DIR/release/modelfleet-$p" "dist/modelfleet-$p"
  done
  printf '%s\n' "$VERSION" > dist/VERSION
  printf '%s\n' "$REVISION" > dist/REVISION
}

images() {
  dist
  log "base: Debian packages into images/base/rootfs"
  bash images/base/rootfs.sh images/base/rootfs
  bah bud --quiet --layers=false -t "$BASE" -f images/base/Containerfile images/base >/dev/null
  for p in "${PROGRAMS[@]}"; do
    log "modelfleet/$p:$VERSION"
    bah bud --quiet --target "$p" -f images/Containerfile \
      --build-arg BASE="$BASE" --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" \
      -t "localhost/modelfleet/$p:$VERSION" dist >/dev/null
  done
  log "modelfleet/store:$VERSION (redis-server from Debian's packages)"
  bash images/store/rootfs.sh images/store/rootfs
  bah bud --quiet --layers=false -f images/store/Containerfile \
    --build-arg BASE="$BASE" --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" \
    -t "localhost/modelfleet/store:$VERSION" images/store >/dev/null
  # Earlier builds' images, untagged now, would pile up in the store run after run.
  bah rmi --prune >/dev/null 2>&1 || true
  bah images --filter reference='localhost/modelfleet/*'
}

push() {
  local registry=${REGISTRY:?set REGISTRY, e.g. make images push REGISTRY=ghcr.io/acme}
  registry=${registry%/}
  local tls=true
  case "$registry" in 127.0.0.1:* | 127.0.0.1 | localhost:* | localhost) tls=false ;; esac
  mkdir -p dist
  local values=dist/helm-values.yaml digest
  declare -A digests
  for p in "${PROGRAMS[@]}" store; do
    log "push $registry/modelfleet/$p:$VERSION"
    bah push --quiet --tls-verify="$tls" --digestfile "dist/$p.digest" \
      "localhost/modelfleet/$p:$VERSION" "docker://$registry/modelfleet/$p:$VERSION"
    digest=$(cat "dist/$p.digest")
    digests[$p]=$digest
  done
  cat > "$values" <<VALUES
# Pins the images \`make images push\` pushed (revision $REVISION): helm install … -f $values
image:
  registry: $registry
  repository: modelfleet/operator
  tag: "$VERSION"
  digest: ${digests[operator]}
gateway:
  image:
    repository: modelfleet/gateway
    tag: "$VERSION"
    digest: ${digests[gateway]}
runtime:
  image:
    repository: modelfleet/runtime
    tag: "$VERSION"
    digest: ${digests[runtime]}
limitsStore:
  image:
    repository: modelfleet/store
    tag: "$VERSION"
    digest: ${digests[store]}
VALUES
  cat "$values"
}

case "${1:-images}" in
  dist) dist ;;
  images) images ;;
  push) push ;;
  *) echo "usage: $0 dist|images|push" >&2; exit 2 ;;
esac
