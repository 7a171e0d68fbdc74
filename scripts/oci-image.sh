#!/usr/bin/env bash
# Builds (once) the OCI bundle the cluster tier's container=oci test runs in, from Debian's packages with
# mmdebstrap (no container registry), and prints its path: a folder with rootfs/ and config.json.
#
#   bash scripts/oci-image.sh            # builds when missing (about 15-30 s), else prints the cached path
#
# The image is Debian 12 "minbase" plus what container.python=host needs of it: the shared libraries the
# host's Python and its wheels link (libssl, libffi, sqlite, bz2, lzma, readline, ncurses, libgomp), and
# SLURM's client with munge's library (the wrapper requeues with scontrol from inside). The run's own paths,
# the Python included, are mounted by swiftslurm (docs/containers.md). Cached under
# ${SWIFTSLURM_IMAGE_CACHE:-$HOME/.cache/swiftslurm/images}/<name>-<hash of this recipe>; every file of the
# image names its recipe in /etc/swiftslurm-image, which the tests look for in a process's root.
set -euo pipefail

SUITE=bookworm
INCLUDE=libssl3,libffi8,libsqlite3-0,libbz2-1.0,liblzma5,zlib1g,libreadline8,libncursesw6,libgomp1,procps,slurm-client,libmunge2,ca-certificates
recipe="mmdebstrap --variant=minbase --include=$INCLUDE $SUITE"
hash=$(printf '%s' "$recipe" | sha256sum | cut -c1-12)
cache=${SWIFTSLURM_IMAGE_CACHE:-$HOME/.cache/swiftslurm/images}
bundle=$cache/debian-$SUITE-$hash

if [[ -f $bundle/rootfs/etc/swiftslurm-image ]]; then
  echo "$bundle"
  exit 0
fi
if ! command -v mmdebstrap >/dev/null; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi
mkdir -p "$cache"
building=$(mktemp -d "$cache/.building-XXXXXX")
trap 'rm -rf "$building"' EXIT
start=$(date +%s)
# shellcheck disable=SC2086  # the recipe is words
$recipe "$building/rootfs" >"$building/mmdebstrap.log" 2>&1 || { cat "$building/mmdebstrap.log" >&2; exit 1; }
echo "$hash $recipe" >"$building/rootfs/etc/swiftslurm-image"
# A bundle of a bare root filesystem; swiftslurm writes each run's own config.json from this one.
cat >"$building/config.json" <<'JSON'
{
 "ociVersion": "1.0.2",
 "process": {"user": {"uid": 0, "gid": 0}, "args": ["sh"], "cwd": "/",
  "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]},
 "root": {"path": "rootfs", "readonly": true},
 "mounts": [
  {"destination": "/proc", "type": "proc", "source": "proc"},
  {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
  {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
   "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
  {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
 ],
 "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]}
}
JSON
rm -f "$building/mmdebstrap.log"
chmod 755 "$building"
mv -T "$building" "$bundle" 2>/dev/null || true  # another build won the race: keep its image
trap - EXIT
rm -rf "$building"
echo "[oci-image] built $bundle in $(($(date +%s) - start)) s" >&2
echo "$bundle"
