#!/usr/bin/env bash
# Writes the limits store image's files into DIR (default images/store/rootfs) from Debian's own
# packages: redis-server (Debian's redis-tools ships the binary) and the libraries it links, beyond
# those the base image already has. As for the base: each package is fetched with `apt-get download`
# and unpacked with `dpkg-deb -x`; no maintainer script runs; no shell, no package manager.
#
# The gateway keeps tenants' request and token buckets, concurrency leases, spend and hourly usage
# records in it (docs/gateway.md, "Tenant limits").
set -euo pipefail
# The same tree from the same packages, whoever runs it: file modes not from the caller's umask, the
# file order of every list from the C locale.
umask 022
export LC_ALL=C
dest=${1:-"$(dirname "${BASH_SOURCE[0]}")/rootfs"}
packages=(redis-tools libatomic1 libjemalloc2 liblzf1 libssl3 libsystemd0 libstdc++6 libcap2 libgcrypt20
  liblzma5 libzstd1 liblz4-1 libgpg-error0)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "${packages[@]}" >/dev/null 2>&1) || {
  apt-get update -qq && (cd "$work" && apt-get download "${packages[@]}" >/dev/null)
}
mkdir -p "$work/x"
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$work/x"
done
rm -rf "$dest"
mkdir -p "$dest/usr/bin" "$dest/data"
# The server is the one binary (it runs as the server when called redis-server).
install -m 0555 "$work/x/usr/bin/redis-check-rdb" "$dest/usr/bin/redis-server"
for d in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu; do
  if [ -d "$work/x/$d" ]; then
    mkdir -p "$dest/$d"
    find "$work/x/$d" -maxdepth 1 \( -type f -o -type l \) -name '*.so*' -exec cp -a {} "$dest/$d/" \;
  fi
done
# The data directory (the chart mounts a volume over it), owned by the user the image runs as.
chown 65532:65532 "$dest/data"
for deb in "$work"/*.deb; do
  printf '%s %s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)"
done > "$dest/.packages-store"
# SOURCE_DATE_EPOCH (images/build.sh sets it, to the commit's time): no file or directory newer than
# that, so the tree's times are the same in every build (the packages' own files keep their older times).
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
  find "$dest" -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
fi
