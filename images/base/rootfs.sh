#!/usr/bin/env bash
# Writes the base image's root file system into DIR (default images/base/rootfs) from Debian's own
# packages: the C library and libgcc (what the release binaries link: libc, libm, libgcc_s, the
# loader) and the Mozilla CA bundle (https:// and hf:// model downloads). Nothing else: no shell, no
# package manager, no dpkg database. Each package is fetched with `apt-get download` (from the
# machine's Debian sources) and unpacked with `dpkg-deb -x`; maintainer scripts do not run, so the CA
# bundle is assembled here as `update-ca-certificates` would. Users: /etc/passwd and /etc/group name
# root and `nonroot` (65532), the user every image runs as.
#
# The same files as gcr.io/distroless/cc-debian12, made without any registry; see docs/install.md.
set -euo pipefail
# The same tree from the same packages, whoever runs it: file modes not from the caller's umask, the
# file order of every list from the C locale.
umask 022
export LC_ALL=C
dest=${1:-"$(dirname "${BASH_SOURCE[0]}")/rootfs"}
packages=(libc6 libgcc-s1 ca-certificates)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "${packages[@]}" 2>/dev/null) || {
  apt-get update -qq && (cd "$work" && apt-get download "${packages[@]}")
}
rm -rf "$dest"
mkdir -p "$dest"
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$dest"
done
# What a program never reads: docs, manuals, lintian overrides, iconv modules, the CA updater (a shell
# script, with no shell to run it).
rm -rf "$dest"/usr/share/doc "$dest"/usr/share/man "$dest"/usr/share/lintian \
  "$dest"/usr/lib/x86_64-linux-gnu/gconv "$dest"/usr/sbin "$dest"/etc/ca-certificates
mkdir -p "$dest"/etc/ssl/certs "$dest"/tmp "$dest"/home/nonroot
find "$dest"/usr/share/ca-certificates -name '*.crt' | LC_ALL=C sort | xargs cat > "$dest"/etc/ssl/certs/ca-certificates.crt
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$dest"/etc/passwd
printf 'root:x:0:\nnonroot:x:65532:\n' > "$dest"/etc/group
printf 'hosts: files dns\n' > "$dest"/etc/nsswitch.conf
chmod 1777 "$dest"/tmp
chown 65532:65532 "$dest"/home/nonroot
# What went in (package and version, one a line): the record of which Debian packages this tree is.
for deb in "$work"/*.deb; do
  printf '%s %s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)"
done > "$dest"/.packages
# SOURCE_DATE_EPOCH (images/build.sh sets it, to the commit's time): no file or directory newer than
# that, so the tree's times are the same in every build (the packages' own files keep their older times).
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
  find "$dest" -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
fi
