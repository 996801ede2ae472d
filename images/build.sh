#!/usr/bin/env bash
# `make dist`, `make images` and `make push`: the release binaries, then the base and the three images
# built from images/Containerfile with buildah — no container daemon, no public registry — and pushed by
# digest to $REGISTRY.
#
#   images/build.sh dist      release binaries of the three programs into dist/ (MODELFLEET_REVISION =
#                             the git commit, so `--version` names it), and the build's inputs beside
#                             them: dist/VERSION, dist/REVISION, dist/SOURCE_DATE_EPOCH
#   images/build.sh images    dist, then localhost/modelfleet/base:bookworm (images/base),
#                             localhost/modelfleet/{operator,gateway,runtime}:$VERSION and the limits
#                             store localhost/modelfleet/store:$VERSION (images/store)
#   images/build.sh images-only   the same images from the dist/ already built (no cargo): what
#                             images/check.sh runs a second time, into a fresh store, to check the
#                             build is reproducible
#   images/build.sh push      pushes those to $REGISTRY/modelfleet/<program>:$VERSION and prints the
#                             chart values that pin them by digest (also written to dist/helm-values.yaml)
#   images/build.sh layout DIR   pushes them, exactly as `push` does (same manifest format, same layer
#                             compression), into the OCI layout DIR instead of a registry, and prints
#                             "<program> <digest>": the digests `push` gives, without a registry
#
# Reproducible (docs/install.md, "Reproducible images"): two builds of one clean commit give the same
# image digests, from any clone and any store. Every timestamp is SOURCE_DATE_EPOCH (the commit's time
# unless set): buildah's --timestamp sets the images' created times, their history's, and every file's
# time in the layers they add; the rootfs trees' times are clamped to it as well. The binaries are
# built with the paths the compiler embeds remapped (see dist). Debian's packages are an input too: the
# versions that went into the base and the store are recorded in /.packages and /.packages-store.
#
# Images live in a containers-storage of their own (~/.cache/modelfleet/containers, or
# $MODELFLEET_IMAGE_STORE; vfs driver: works on any file system, nested overlays included), so nothing
# else on the machine is touched. The base's and the store's rootfs trees are written under
# images/{base,store}/rootfs (or $MODELFLEET_BUILD_DIR/{base,store}/rootfs). A registry on 127.0.0.1 or
# localhost is spoken to over plain HTTP (the harness's loopback registry); any other over TLS, with the
# credentials `buildah login` stored.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$REVISION" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  # A dirty tree's images hold what is not in any commit: they need not be reproducible.
  REVISION="$REVISION-dirty"
fi
PROGRAMS=(operator gateway runtime)
BASE=localhost/modelfleet/base:bookworm
STORE=${MODELFLEET_IMAGE_STORE:-$HOME/.cache/modelfleet/containers}
BUILD_DIR=${MODELFLEET_BUILD_DIR:-images}
TARGET_DIR=${CARGO_TARGET_DIR:-target}

log() { echo "[images $(date +%H:%M:%S)] $*" >&2; }
bah() { buildah --root "$STORE/storage" --runroot "$STORE/run" --storage-driver vfs "$@"; }
# An absolute path, symbolic links kept (as cargo and rustc see it), no trailing slash.
abs() { case "$1" in /*) echo "${1%/}" ;; *) echo "$PWD/${1%/}" ;; esac; }

dist() {
  # The time every file and record in the images carries: the commit's, so one commit's images are the
  # same whenever they are built (a source tree without git: SOURCE_DATE_EPOCH, or 1970).
  local epoch=${SOURCE_DATE_EPOCH:-}
  if [ -z "$epoch" ]; then
    epoch=$(git log -1 --format=%ct 2>/dev/null) || epoch=0
  fi
  # Paths rustc embeds in the binaries (dependencies' panic locations, code generated into OUT_DIR)
  # name this machine's cargo home and target directory: remapped to fixed names, so the binaries do not
  # depend on where they are built. The workspace's own sources reach rustc as paths relative to the
  # checkout, so the checkout's path is not embedded, and these flags do not depend on it: clones sharing
  # one CARGO_TARGET_DIR share its cache (a change of RUSTFLAGS rebuilds every crate). RUSTFLAGS from the
  # environment are kept (and are an input); like any RUSTFLAGS, these make cargo ignore a config file's
  # build.rustflags.
  local remap
  remap="--remap-path-prefix=$(abs "${CARGO_HOME:-$HOME/.cargo}")=/cargo"
  remap+=" --remap-path-prefix=$(abs "$TARGET_DIR")=/target"
  log "cargo build --release (revision $REVISION)"
  RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }$remap" MODELFLEET_REVISION=$REVISION \
    cargo build --release --locked --bins -p modelfleet-operator -p modelfleet-gateway -p modelfleet-runtime
  mkdir -p dist
  # Without their symbol tables (a quarter of each binary: the operator's image would pass its 40 MB
  # target otherwise): a panic still reports its message and file:line, only a RUST_BACKTRACE's frames
  # are unnamed. The release profile keeps them, so benchmarks and profilers on a local build have them.
  for p in "${PROGRAMS[@]}"; do
    rm -f "dist/modelfleet-$p"
    strip --strip-all -o "dist/modelfleet-$p" "$TARGET_DIR/release/modelfleet-$p"
    chmod 0555 "dist/modelfleet-$p"
  done
  # Their time too (buildah's --timestamp sets it in the layer anyway; a docker build copies it as is).
  touch -d "@$epoch" "${PROGRAMS[@]/#/dist/modelfleet-}"
  printf '%s\n' "$VERSION" > dist/VERSION
  printf '%s\n' "$REVISION" > dist/REVISION
  printf '%s\n' "$epoch" > dist/SOURCE_DATE_EPOCH
}

# The images from dist/ (its binaries, and the version, revision and time they were built with).
build_images() {
  local version revision epoch
  [ -f dist/SOURCE_DATE_EPOCH ] || { echo "no dist/SOURCE_DATE_EPOCH: run images/build.sh dist" >&2; exit 1; }
  version=$(cat dist/VERSION)
  revision=$(cat dist/REVISION)
  epoch=$(cat dist/SOURCE_DATE_EPOCH)
  # One format, no cached layers, and every time (created, history, the files of each layer) the
  # commit's — whatever the environment (BUILDAH_FORMAT, BUILDAH_LAYERS) says.
  local bud=(bud --quiet --format oci --layers=false --timestamp "$epoch")
  local args=(--build-arg BASE="$BASE" --build-arg VERSION="$version" --build-arg REVISION="$revision")
  log "base: Debian packages into $BUILD_DIR/base/rootfs (times clamped to $epoch)"
  SOURCE_DATE_EPOCH=$epoch bash images/base/rootfs.sh "$BUILD_DIR/base/rootfs"
  log "base: $(paste -sd, "$BUILD_DIR/base/rootfs/.packages" | sed 's/,/, /g') (recorded in /.packages)"
  bah "${bud[@]}" -t "$BASE" -f images/base/Containerfile "$BUILD_DIR/base" >/dev/null
  for p in "${PROGRAMS[@]}"; do
    log "modelfleet/$p:$version"
    bah "${bud[@]}" --target "$p" -f images/Containerfile "${args[@]}" \
      -t "localhost/modelfleet/$p:$version" dist >/dev/null
  done
  log "modelfleet/store:$version (redis-server from Debian's packages)"
  SOURCE_DATE_EPOCH=$epoch bash images/store/rootfs.sh "$BUILD_DIR/store/rootfs"
  log "store: $(paste -sd, "$BUILD_DIR/store/rootfs/.packages-store" | sed 's/,/, /g') (recorded in /.packages-store)"
  bah "${bud[@]}" -f images/store/Containerfile "${args[@]}" \
    -t "localhost/modelfleet/store:$version" "$BUILD_DIR/store" >/dev/null
  # Earlier builds' images, untagged now, would pile up in the store run after run.
  bah rmi --prune >/dev/null 2>&1 || true
  # Each image and its digest (the manifest's, in this store; `make push` prints the pushed ones).
  bah images --format '{{.Name}}:{{.Tag}} {{.Digest}} {{.Size}}' --filter reference='localhost/modelfleet/*'
}

images() {
  dist
  build_images
}

# Pushes one image as `push` and `layout` do: its OCI manifest, its layers gzip-compressed (explicitly,
# whatever containers.conf says: the compressed bytes are in the digest).
push_image() {
  local p=$1 dest=$2 digestfile=$3
  shift 3
  bah push --quiet --compression-format gzip --digestfile "$digestfile" "$@" \
    "localhost/modelfleet/$p:$VERSION" "$dest"
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
    push_image "$p" "docker://$registry/modelfleet/$p:$VERSION" "dist/$p.digest" --tls-verify="$tls"
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

# The four images into an OCI layout: the digests a push gives, with no registry. Each layer is
# compressed anew (a fresh layout has no blob to reuse), so two builds agree only if their bytes do.
layout() {
  local dir=${1:?usage: images/build.sh layout DIR}
  mkdir -p "$dir"
  for p in "${PROGRAMS[@]}" store; do
    push_image "$p" "oci:$dir:$p" "$dir/$p.digest"
    printf '%s %s\n' "$p" "$(cat "$dir/$p.digest")"
  done
}

case "${1:-images}" in
  dist) dist ;;
  images) images ;;
  images-only) build_images ;;
  push) push ;;
  layout) layout "${2:-}" ;;
  *) echo "usage: $0 dist|images|images-only|push|layout DIR" >&2; exit 2 ;;
esac
