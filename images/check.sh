#!/usr/bin/env bash
# Checks the images `make images` built, for real (run by `make test`): the three programs' and the
# limits store's (redis-server from Debian's packages; the same checks, its entrypoint redis-server):
#   - config: user 65532:65532 (not root), the entrypoint is the program, the OCI labels
#     (source, revision = this build's, version, licenses) are set;
#   - content: no shell, no package manager; size within its target (operator and gateway 40 MB,
#     runtime 120 MB, uncompressed);
#   - it runs: unpacked (umoci) and started by runc as that user, with a read-only root file system
#     and no capabilities — `--version` prints the version and revision, and the runtime's `digest` of a
#     small file mounted read-only matches the digest the same binary computes on the host.
# Prints one line per image: its size and what passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=$(cat dist/VERSION)
REVISION=$(cat dist/REVISION)
STORE=${MODELFLEET_IMAGE_STORE:-$HOME/.cache/modelfleet/containers}
storage="containers-storage:[vfs@$STORE/storage+$STORE/run]"
declare -A LIMIT_MB=([operator]=40 [gateway]=40 [runtime]=120 [store]=30)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "[check] FAIL: $*" >&2; exit 1; }

# A small artifact, and what the host says its digest is.
mkdir -p "$work/data"
printf 'modelfleet image check\n' > "$work/data/weights.bin"
want_digest=$(dist/modelfleet-runtime digest "$work/data/weights.bin")

for p in operator gateway runtime store; do
  ref="localhost/modelfleet/$p:$VERSION"
  skopeo inspect --config "$storage$ref" > "$work/$p.config.json"
  python3 - "$p" "$VERSION" "$REVISION" "$work/$p.config.json" <<'PY' || fail "$p: config"
import json, sys
p, version, revision, path = sys.argv[1:]
c = json.load(open(path))["config"]
user = c.get("User", "")
assert user == "65532:65532", f"user is {user!r}, want 65532:65532"
entry = "/usr/bin/redis-server" if p == "store" else f"/usr/local/bin/modelfleet-{p}"
assert c.get("Entrypoint") == [entry], c.get("Entrypoint")
labels = c.get("Labels") or {}
license = "BSD-3-Clause" if p == "store" else "Apache-2.0"
for k, want in [("org.opencontainers.image.source", None), ("org.opencontainers.image.revision", revision),
                ("org.opencontainers.image.version", version), ("org.opencontainers.image.licenses", license)]:
    assert labels.get(k), f"label {k} missing"
    assert want is None or labels[k] == want, f"label {k} = {labels[k]!r}, want {want!r}"
PY
  skopeo copy --quiet "$storage$ref" "oci:$work/oci:$p"
  umoci unpack --image "$work/oci:$p" "$work/$p" >/dev/null
  rootfs="$work/$p/rootfs"
  for forbidden in bin/sh usr/bin/sh bin/bash usr/bin/apt usr/bin/dpkg usr/bin/apt-get sbin/apk; do
    [ ! -e "$rootfs/$forbidden" ] || fail "$p: /$forbidden exists"
  done
  [ -z "$(find "$rootfs" -perm -4000 -o -perm -2000 | head -1)" ] || fail "$p: setuid/setgid files"
  bytes=$(du -sb "$rootfs" | cut -f1)
  mb=$(python3 -c "print(f'{$bytes/1e6:.1f}')")
  python3 -c "import sys; sys.exit(0 if $bytes <= ${LIMIT_MB[$p]} * 1000000 else 1)" ||
    fail "$p: $mb MB uncompressed, over the ${LIMIT_MB[$p]} MB target"

  # Run it as the image says, with the root file system read-only and no capabilities.
  run() {
    local name=$1; shift
    python3 - "$work/$p/config.json" "$work/data" "$@" <<'PY'
import json, sys
path, data, *args = sys.argv[1:]
c = json.load(open(path))
c["process"]["args"] = args
c["process"]["terminal"] = False
c["root"]["readonly"] = True
for k in ("bounding", "effective", "inheritable", "permitted", "ambient"):
    c["process"].setdefault("capabilities", {})[k] = []
c["process"]["noNewPrivileges"] = True
c["mounts"].append({"destination": "/data", "type": "bind", "source": data, "options": ["rbind", "ro"]})
c["linux"].pop("uidMappings", None); c["linux"].pop("gidMappings", None)
json.dump(c, open(path, "w"))
PY
    (cd "$work/$p" && runc run --bundle . "mf-check-$p-$name-$$" < /dev/null)
  }
  if [ "$p" = store ]; then
    out=$(run version /usr/bin/redis-server --version) || fail "store: --version did not run"
    case "$out" in "Redis server v="*) ;; *) fail "store: --version printed '$out'" ;; esac
  else
    out=$(run version "/usr/local/bin/modelfleet-$p" --version) || fail "$p: --version did not run"
    [ "$out" = "modelfleet-$p $VERSION (revision $REVISION)" ] || fail "$p: --version printed '$out'"
  fi
  uid=$(python3 -c "import json; u=json.load(open('$work/$p/config.json'))['process']['user']; print(u['uid'], u['gid'])")
  [ "$uid" = "65532 65532" ] || fail "$p: runs as $uid"
  extra=""
  if [ "$p" = runtime ]; then
    got=$(run digest /usr/local/bin/modelfleet-runtime digest /data/weights.bin) || fail "runtime: digest did not run"
    [ "$got" = "$want_digest" ] || fail "runtime: digest in the image $got, on the host $want_digest"
    extra=", digest of a mounted file as on the host"
  fi
  echo "[check] modelfleet/$p:$VERSION: $mb MB uncompressed (target ${LIMIT_MB[$p]} MB), user 65532:65532, labels, no shell; ran under runc read-only: '$out'$extra"
done
