#!/usr/bin/env bash
# The "fresh machine" of the README's Quick start, as an image: a minimal Debian 12 made with
# debootstrap holding only what the README's requirements sentence asks for (its apt-get line,
# PACKAGES below; tests/docker/test_bare_recipe.py keeps the two equal). No ninja-build, no CUDA,
# no pip packages: `make train` / `make test` must set everything else up themselves.
# tests/docker/test_readme_bare_machine.py runs this once per machine and caches the result under a
# tag derived from this file.
#
#   BUILDAH="buildah --storage-driver vfs" tests/docker/make_bare_image.sh IMAGE
#
# DEBIAN_MIRROR overrides the package mirror. Root only (debootstrap, buildah).
set -euo pipefail

# The README's `apt-get install` line, word for word (git: the clone itself).
PACKAGES="python3-venv python3-dev g++ make git"

if [[ $# -ne 1 ]]; then
    echo "usage: $0 IMAGE" >&2
    exit 2
fi
image="$1"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
read -r -a buildah <<< "${BUILDAH:-buildah}"

container="$("${buildah[@]}" from scratch)"
cleanup() {
    "${buildah[@]}" rm "${container}" > /dev/null 2>&1 || true
}
trap cleanup EXIT
rootfs="$("${buildah[@]}" mount "${container}")"

# minbase: the Essential packages and apt; --include adds the README's packages and their
# dependencies (not their Recommends, which apt-get would add: the image is the stricter machine).
debootstrap --variant=minbase --include="${PACKAGES// /,}" bookworm "${rootfs}" "${mirror}"
rm -rf "${rootfs}"/var/lib/apt/lists/* "${rootfs}"/var/cache/apt/*.bin "${rootfs}"/var/cache/apt/archives/*.deb
"${buildah[@]}" umount "${container}" > /dev/null

"${buildah[@]}" config --cmd bash --label org.opencontainers.image.description="SyncTrain bare machine: Debian 12 + ${PACKAGES}" \
    "${container}"
"${buildah[@]}" commit --rm "${container}" "${image}"
trap - EXIT
