#!/bin/sh
# Make a local Debian base image without a registry: debootstrap + docker import (needs root).
# Usage: docker/bootstrap-base.sh [TAG] [SUITE] [MIRROR]   (default local/debian:bookworm bookworm deb.debian.org)
# Idempotent: an existing TAG is left alone. The Python equivalent is attnforge.engine.backends.debian_base.
set -eu
TAG=${1:-local/debian:bookworm}
SUITE=${2:-bookworm}
MIRROR=${3:-http://deb.debian.org/debian}
DOCKER=${DOCKER:-/usr/bin/docker}

if "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
    echo "$TAG exists"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 5; }
ROOTFS=$(mktemp -d /tmp/attnforge-rootfs-XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
debootstrap --variant=minbase "$SUITE" "$ROOTFS/rootfs" "$MIRROR"
rm -f "$ROOTFS"/rootfs/var/cache/apt/archives/*.deb "$ROOTFS"/rootfs/var/lib/apt/lists/*_* 2>/dev/null || true
tar -C "$ROOTFS/rootfs" --numeric-owner -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$TAG"
echo "$TAG created"
