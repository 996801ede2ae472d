#!/usr/bin/env bash
# Checks the images `make images` built, for real (run by `make test`): the three programs' and the
# limits store's (redis-server from Debian's packages; the same checks, its entrypoint redis-server):
#   - config: user 65532:65532 (not root), the entrypoint is the program, the OCI labels
#     (source, revision = this build's, version, licenses) are set;
#   - content: no shell, no package manager; size within its target (operator and gateway 40 MB,
#     runtime 120 MB, uncompressed);
#   - it runs: unpacked (umoci) and started by runc as that user, with a read-only root file system
#     and no capabilities — `--version` prints the version and revision, and the runtime's `digest` of a
#     small file mounted read-only matches the digest the same binary computes on the host;
#   - reproducible: the images built a second time from the same dist/ (`images/build.sh images-only`:
#     fresh rootfs trees, from Debian's packages fetched anew, into a fresh, separate buildah store) are
#     the same, byte for byte — the same manifest digest in the store, and the same digest pushed
#     (`images/build.sh layout`: the manifest and gzip-compressed layers `make push` pins, each layer
#     compressed anew). On a difference it prints what differs: the config, and each layer's files.
# Prints one line per image: its size and what passed; then one per image: its digests in both builds.
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

# Reproducible: the second build, into a store and rootfs trees of its own (docs/install.md,
# "Reproducible images"). The binaries are the same dist/ — no second cargo build.
second="$work/second"
second_storage="containers-storage:[vfs@$second/containers/storage+$second/containers/run]"
started=$SECONDS
MODELFLEET_IMAGE_STORE="$second/containers" MODELFLEET_BUILD_DIR="$second/build" \
  bash images/build.sh images-only > "$work/second.log" 2>&1 || {
  cat "$work/second.log" >&2
  fail "the second build did not run"
}
bash images/build.sh layout "$work/layout1" > "$work/pushed1"
MODELFLEET_IMAGE_STORE="$second/containers" bash images/build.sh layout "$work/layout2" > "$work/pushed2"

# What differs between the two builds of image $1: the configs, then every file that is not the same
# in both layers (type, mode, owner, size, time, link, content), with both contents if short text.
explain() {
  local p=$1 ref="localhost/modelfleet/$1:$VERSION"
  skopeo inspect --config "$storage$ref" | python3 -m json.tool > "$work/$p.config1"
  skopeo inspect --config "$second_storage$ref" | python3 -m json.tool > "$work/$p.config2"
  diff "$work/$p.config1" "$work/$p.config2" >&2 || true
  python3 - "$p" "$work/layout1" "$work/layout2" <<'PY' >&2
import hashlib, json, sys, tarfile
p, *layouts = sys.argv[1:]
def blob(layout, digest):
    return f"{layout}/blobs/{digest.replace(':', '/')}"
def layers(layout):
    index = json.load(open(f"{layout}/index.json"))
    m = next(m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == p)
    return [l["digest"] for l in json.load(open(blob(layout, m["digest"])))["layers"]]
def entries(layout, digest):
    out = {}
    with tarfile.open(blob(layout, digest)) as t:
        for m in t:
            data = t.extractfile(m).read() if m.isfile() else b""
            out[m.name] = (dict(type=m.type, mode=oct(m.mode), owner=f"{m.uid}:{m.gid}", size=m.size,
                                mtime=m.mtime, link=m.linkname,
                                content=hashlib.sha256(data).hexdigest()[:16]), data)
    return out
absent = (dict(present=False), b"")
for i, (a, b) in enumerate(zip(*map(layers, layouts))):
    if a == b:
        continue
    ea, eb = entries(layouts[0], a), entries(layouts[1], b)
    diffs = [n for n in sorted(set(ea) | set(eb)) if ea.get(n, absent)[0] != eb.get(n, absent)[0]]
    print(f"{p}: layer {i} differs ({a} / {b}): {len(diffs)} of its files")
    for n in diffs[:20]:
        (fa, da), (fb, db) = ea.get(n, absent), eb.get(n, absent)
        keys = [k for k in dict.fromkeys([*fa, *fb]) if fa.get(k) != fb.get(k)]
        print(f"  /{n}: " + ", ".join(f"{k} {fa.get(k)} / {fb.get(k)}" for k in keys))
        if "content" in keys and all(d and len(d) < 2000 and d.isascii() for d in (da, db)):
            for label, d in (("first", da), ("second", db)):
                print(f"    {label}: | " + d.decode().rstrip().replace("\n", "\n           | "))
    if len(diffs) > 20:
        print(f"  … and {len(diffs) - 20} more")
PY
}

differ=()
for p in operator gateway runtime store; do
  ref="localhost/modelfleet/$p:$VERSION"
  first=$(skopeo inspect --format '{{.Digest}}' "$storage$ref")
  again=$(skopeo inspect --format '{{.Digest}}' "$second_storage$ref")
  pushed=$(awk -v p="$p" '$1 == p { print $2 }' "$work/pushed1")
  pushed_again=$(awk -v p="$p" '$1 == p { print $2 }' "$work/pushed2")
  [ -n "$pushed" ] && [ -n "$pushed_again" ] || fail "$p: no pushed digest"
  if [ "$first" = "$again" ] && [ "$pushed" = "$pushed_again" ]; then
    echo "[check] modelfleet/$p:$VERSION reproducible: built twice, $first in both stores, pushed as $pushed in both"
  else
    echo "[check] modelfleet/$p:$VERSION: first build $first (pushed $pushed), second $again (pushed $pushed_again)" >&2
    explain "$p"
    differ+=("$p")
  fi
done
[ ${#differ[@]} -eq 0 ] || fail "not reproducible: ${differ[*]} differ between two builds of the same dist/ (above: what)"
echo "[check] reproducibility: the second build and both pushes took $((SECONDS - started)) s"
