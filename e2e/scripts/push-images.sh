#!/usr/bin/env bash
# Pushes the release images to the local cluster's registry ($MF_REGISTRY, from `e2e/cluster env`) and
# writes dist/helm-values.yaml, the chart values that pin them by digest. Builds them first (make images)
# unless the images in the local store were built from this very commit with a clean tree (as `make
# test` does just before the end-to-end suite): a dirty tree always rebuilds. Then the test peers'
# images the scenarios run as pods: versitygw (an S3 server) as
# $MF_REGISTRY/modelfleet-e2e/versitygw:$VERSITYGW_VERSION, and Jaeger (the trace backend) as
# $MF_REGISTRY/modelfleet-e2e/jaeger:$JAEGER_VERSION.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source e2e/scripts/versions.sh
: "${MF_REGISTRY:?run: eval \"\$(e2e/cluster env)\"}"
rev=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || rev=dirty
built=$(cat dist/REVISION 2>/dev/null || echo none)
if [ "$rev" = dirty ] || [ "$built" != "$rev" ] || ! REGISTRY=$MF_REGISTRY bash images/build.sh push >/dev/null 2>&1; then
  bash images/build.sh images >/dev/null
  REGISTRY=$MF_REGISTRY bash images/build.sh push >/dev/null
fi
echo "[e2e] images pushed to $MF_REGISTRY (revision $(cat dist/REVISION)): dist/helm-values.yaml" >&2

STORE=${MODELFLEET_IMAGE_STORE:-$HOME/.cache/modelfleet/containers}
bah() { buildah --root "$STORE/storage" --runroot "$STORE/run" --storage-driver vfs "$@"; }
[ -x "$MF_TOOLS_BIN/versitygw" ] || bash e2e/scripts/build-tools.sh versitygw
ctx=$(mktemp -d)
jctx=$(mktemp -d)
trap 'rm -rf "$ctx" "$jctx"' EXIT
install -m 0555 "$MF_TOOLS_BIN/versitygw" "$ctx/versitygw"
ref="localhost/modelfleet-e2e/versitygw:$VERSITYGW_VERSION"
bah bud --quiet --timestamp 0 -f e2e/images/versitygw/Containerfile -t "$ref" "$ctx" >/dev/null
bah push --quiet --tls-verify=false "$ref" "docker://$MF_REGISTRY/modelfleet-e2e/versitygw:$VERSITYGW_VERSION"
echo "[e2e] versitygw $VERSITYGW_VERSION pushed to $MF_REGISTRY/modelfleet-e2e/versitygw" >&2

[ -x "$MF_JAEGER_BIN/jaeger" ] || bash e2e/scripts/build-tools.sh jaeger
install -m 0555 "$MF_JAEGER_BIN/jaeger" "$jctx/jaeger"
install -m 0444 e2e/images/jaeger/config.yaml "$jctx/config.yaml"
ref="localhost/modelfleet-e2e/jaeger:$JAEGER_VERSION"
bah bud --quiet --timestamp 0 -f e2e/images/jaeger/Containerfile -t "$ref" "$jctx" >/dev/null
bah push --quiet --tls-verify=false "$ref" "docker://$MF_REGISTRY/modelfleet-e2e/jaeger:$JAEGER_VERSION"
echo "[e2e] jaeger $JAEGER_VERSION pushed to $MF_REGISTRY/modelfleet-e2e/jaeger" >&2
