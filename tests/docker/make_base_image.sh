#!/usr/bin/env bash
# The base image the docker tests build the repository's Dockerfile on (--build-arg BASE_IMAGE):
# a minimal Debian 12 made with debootstrap (python3, pip, g++, make) plus the pinned torch and
# torchvision installed from a local folder of wheels. It stands in for the pinned PyTorch devel
# image, which no registry here can serve; it has no CUDA toolkit, so the Dockerfile is built on it
# with BUILD_CUDA_KERNELS=0. tests/docker/conftest.py runs this once and caches the result under a
# tag derived from this file and requirements.txt.
#
#   BUILDAH="buildah --storage-driver vfs" tests/docker/make_base_image.sh IMAGE WHEELHOUSE torch==X torchvision==Y
#
# IMAGE: the tag to commit; WHEELHOUSE: a folder with the wheels for the requirements that follow
# (and their dependencies), e.g. from `pip download`; DEBIAN_MIRROR overrides the package mirror.
# Root only (debootstrap, buildah's chroot isolation).
set -euo pipefail

if [[ $# -lt 3 ]]; then
    echo "usage: $0 IMAGE WHEELHOUSE REQUIREMENT..." >&2
    exit 2
fi
image="$1"
wheelhouse="$(realpath "$2")"
shift 2
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
read -r -a buildah <<< "${BUILDAH:-buildah}"

container="$("${buildah[@]}" from scratch)"
cleanup() {
    "${buildah[@]}" rm "${container}" > /dev/null 2>&1 || true
}
trap cleanup EXIT
rootfs="$("${buildah[@]}" mount "${container}")"

# minbase: the Essential packages and apt, nothing else; passwd (useradd) is among them.
debootstrap --variant=minbase --include=python3,python3-pip,g++,make bookworm "${rootfs}" "${mirror}"
# Package lists and downloaded .debs are build leftovers, not part of a base.
rm -rf "${rootfs}"/var/lib/apt/lists/* "${rootfs}"/var/cache/apt/*.bin "${rootfs}"/var/cache/apt/archives/*.deb
"${buildah[@]}" umount "${container}" > /dev/null

# The wheelhouse is mounted, not copied: the wheels (about 3 GB for the CUDA build of torch and its
# nvidia-* libraries) never land in a layer, only what pip installs from them.
"${buildah[@]}" run --isolation chroot --volume "${wheelhouse}:/wheelhouse:ro" "${container}" -- \
    python3 -m pip install --no-cache-dir --no-index --find-links /wheelhouse --break-system-packages "$@"
"${buildah[@]}" run --isolation chroot "${container}" -- \
    python3 -c "import torch, torchvision; print('base image: torch', torch.__version__, 'torchvision', torchvision.__version__)"

"${buildah[@]}" config --cmd python3 --label org.opencontainers.image.description="SyncTrain test base: Debian 12 + $*" \
    "${container}"
"${buildah[@]}" commit --rm "${container}" "${image}"
trap - EXIT
