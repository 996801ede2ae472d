#!/usr/bin/env bash
# Pushes the release images to the local cluster's registry ($MF_REGISTRY, from `e2e/cluster env`) and
# writes dist/helm-values.yaml, the chart values that pin them by digest. Builds them first (make images)
# unless the images in the local store were built from this very commit with a clean tree (as `make
# test` does just before the end-to-end suite): a dirty tree always rebuilds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
: "${MF_REGISTRY:?run: eval \"\$(e2e/cluster env)\"}"
rev=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || rev=dirty
built=$(cat dist/REVISION 2>/dev/null || echo none)
if [ "$rev" = dirty ] || [ "$built" != "$rev" ] || ! REGISTRY=$MF_REGISTRY bash images/build.sh push >/dev/null 2>&1; then
  bash images/build.sh images >/dev/null
  REGISTRY=$MF_REGISTRY bash images/build.sh push >/dev/null
fi
echo "[e2e] images pushed to $MF_REGISTRY (revision $(cat dist/REVISION)): dist/helm-values.yaml" >&2
