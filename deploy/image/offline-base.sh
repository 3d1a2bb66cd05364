#!/bin/sh
# A base image for deploy/Containerfile made without any container registry: Debian bookworm's
# minbase plus python3 (3.11), python3-venv and ca-certificates, bootstrapped by mmdebstrap
# from Debian's own archive (bookworm, bookworm-updates and bookworm-security), then committed
# with buildah. The tests build the image on it, since no registry is reachable where they run;
# it also suits a site that pulls nothing from Docker Hub.
#
#   deploy/image/offline-base.sh [IMAGE]     (default localhost/vigil-base:bookworm)
#
# Needs root (mmdebstrap's root mode; buildah's default storage, or the one that
# CONTAINERS_STORAGE_CONF names), mmdebstrap and buildah.
set -eu

image=${1:-localhost/vigil-base:bookworm}
work=$(mktemp -d "${TMPDIR:-/var/tmp}/vigil-base.XXXXXX")
container=
cleanup() {
    [ -z "$container" ] || buildah rm "$container" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# Documentation, man pages and translations are dropped the way Debian's own slim images
# drop them (their copyright files stay): nothing in the image reads them. The apt lists and
# caches are emptied by mmdebstrap itself.
mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    --dpkgopt=force-unsafe-io \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$work/rootfs.tar"

container=$(buildah from scratch)
buildah add "$container" "$work/rootfs.tar" /
# What an image's user expects of a base: python3 on PATH, a shell as the default command.
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/sh \
    --label org.opencontainers.image.title=vigil-base \
    --label "org.opencontainers.image.description=Debian bookworm minbase with python3, python3-venv and ca-certificates (mmdebstrap)" \
    "$container"
buildah commit --rm "$container" "$image"
container=
