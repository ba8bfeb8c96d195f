# SyncTrain training image: the repository, its requirements and the SyncBN kernels compiled ahead
# of time, with torchrun as the entry point. Build and run commands: docs/clusters.md.
#
#   docker build -t synctrain --build-arg TORCH_CUDA_ARCH_LIST="8.0 9.0+PTX" .
#   docker run --rm --gpus all --ipc=host synctrain                      # default job on every GPU
#   docker run --rm --gpus all --ipc=host synctrain --standalone --nproc_per_node=gpu train.py model=resnet50
#
# Base image: PyTorch's official *devel* image for exactly the torch build requirements.txt pins
# (torch 2.14.1 built for CUDA 13.0, i.e. 2.14.1+cu130, cuDNN 9). "devel" because the SyncBN
# extension is compiled with nvcc and the CUDA headers (runtime images have neither), here at build
# time and again inside the container if someone targets another GPU architecture. Pinned by tag so
# a rebuild gets the same toolchain; to move CUDA or torch, change this tag and requirements.txt
# together (the constraints step below fails loudly if the image has no torch).
# BASE_IMAGE replaces it with any image that has python3, pip, a C++ compiler and the pinned torch
# and torchvision (the tests build on a Debian base made with debootstrap); without nvcc there,
# add --build-arg BUILD_CUDA_KERNELS=0.
ARG BASE_IMAGE=pytorch/pytorch:2.14.1-cuda13.0-cudnn9-devel
FROM ${BASE_IMAGE}

# pipefail: a failing command on the left of a pipe must fail the build (hadolint DL4006).
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# GPU architectures the CUDA kernels are compiled for (compute capability; "+PTX" also embeds PTX
# that the driver JIT-compiles for newer GPUs). 8.0 = A100, 8.6 = RTX 30xx/A10, 8.9 = L4/RTX 40xx,
# 9.0 = H100/H200, 10.0 = B200, 12.0 = RTX 50xx. Fewer architectures build faster.
ARG TORCH_CUDA_ARCH_LIST="8.0 9.0+PTX"
# 1: compile the CUDA kernels too (nvcc, which the devel base has; a missing nvcc fails the build).
# 0: the CPU kernels only, for a base without a CUDA toolkit; on a GPU the loader then compiles the
# CUDA variant at first use if it finds nvcc, and otherwise says why it cannot.
ARG BUILD_CUDA_KERNELS=1
# CPU variants of the kernels to build: "all" (default, AVX-512, AVX2; the loader picks the one
# matching the CPU it runs on) or a comma-separated subset for an image that only runs on known CPUs
# (each variant is a minute or two of compiling).
ARG SYNCBN_CPU_CAPABILITIES=all
# The unprivileged user the container runs as. Match your host ids so that files written to mounted
# output folders are yours: --build-arg USER_UID=$(id -u) --build-arg USER_GID=$(id -g).
ARG APP_USER=synctrain
ARG USER_UID=1000
ARG USER_GID=1000
# Where pip finds CUDA 13.0 builds of torch/torchvision, should requirements.txt need one the base
# image lacks (PyPI's default wheels may target another CUDA version). Empty: PyPI only (for a
# build host that cannot reach download.pytorch.org; the base must then carry torch already).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130

# The base's Python may be a distribution's system Python marked externally managed (PEP 668:
# Ubuntu 24.04, Debian 12); this container has one purpose, so installing into it is what we want.
# `python3`, not `python`, everywhere: Debian has no `python` command without python-is-python3.
# TORCH_CUDA_ARCH_LIST stays set at run time so that a rebuild inside the container (new sources)
# targets the same GPUs; SYNCTRAIN_EXTENSIONS_DIR is where src.syncbn looks for the compiled kernels.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    SYNCTRAIN_EXTENSIONS_DIR=/opt/synctrain/build/torch_extensions

# The kernels compile against Python's headers. The default base (conda's Python) has them; a
# distribution's Python (Debian, Ubuntu) keeps them in python3-dev, installed here when missing,
# with apt-get: Debian-family bases only, elsewhere the build stops and says what is missing.
# DL3008 (pin apt versions): the version must be the one matching the base's python3, which apt picks.
# hadolint ignore=DL3008
RUN python_h="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h"; \
    if [ ! -f "${python_h}" ]; then \
        if ! command -v apt-get > /dev/null; then \
            echo "${python_h} is missing and there is no apt-get: use a base with Python's headers" >&2; exit 1; \
        fi; \
        apt-get update && apt-get install -y --no-install-recommends python3-dev \
            && apt-get clean && rm -rf /var/lib/apt/lists/*; \
    fi

# Ubuntu 24.04 images ship a user "ubuntu" with UID/GID 1000; free the requested ids first so that
# our user gets exactly them (a no-op on bases without such a user, e.g. Debian's). useradd and
# groupadd come from the passwd package that every Debian/Ubuntu base has. getent exits 2 for an
# unknown id, which pipefail would turn into a failed build: "|| true".
RUN existing_user="$(getent passwd "${USER_UID}" | cut -d: -f1 || true)" \
    && if [ -n "${existing_user}" ]; then userdel "${existing_user}"; fi \
    && existing_group="$(getent group "${USER_GID}" | cut -d: -f1 || true)" \
    && if [ -n "${existing_group}" ]; then groupdel "${existing_group}"; fi \
    && groupadd --gid "${USER_GID}" "${APP_USER}" \
    && useradd --uid "${USER_UID}" --gid "${USER_GID}" --create-home --shell /bin/bash "${APP_USER}" \
    && mkdir -p /opt/synctrain /data /outputs \
    && chown "${USER_UID}:${USER_GID}" /opt/synctrain /data /outputs

WORKDIR /opt/synctrain

# Requirements first, in their own layer: editing the code does not reinstall them. Importing torch
# leaves an empty /tmp/torchinductor_<user>; it goes with the other temporary files. The constraints
# file pins torch/torchvision to the builds already in the image, so pip can never replace the
# image's CUDA 13.0 torch with a wheel built for another CUDA (requirements.txt's torch==2.14.1
# matches the installed 2.14.1+cu130: PEP 440 ignores the local "+cu130" label). grep fails the build
# if the base image has no torch at all.
COPY requirements.txt ./
RUN python3 -m pip list --format=freeze | grep -iE '^(torch|torchvision)==' > /tmp/torch-constraints.txt \
    && python3 -m pip install --no-cache-dir ${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"} \
        -c /tmp/torch-constraints.txt -r requirements.txt \
    && python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)" \
    && rm -rf /tmp/torch-constraints.txt /tmp/torchinductor_*

COPY --chown=${USER_UID}:${USER_GID} . .

USER ${APP_USER}

# Compile the SyncBN kernels now (C++ and CUDA; nvcc needs no GPU) into SYNCTRAIN_EXTENSIONS_DIR,
# so workers load them at start-up instead of compiling on every node of every job. Every CPU
# variant unless SYNCBN_CPU_CAPABILITIES says otherwise: the loader picks the one matching the CPU
# it runs on, which is not necessarily the build machine's. The object files go: the loader needs
# only each variant's library and BUILD_OK marker, and a rebuild (other sources or GPU
# architectures) happens in a fresh directory anyway. The cache is made writable for any user: that rebuild and its lock file
# must work under `docker run --user` too.
RUN cuda_flag="--cuda"; if [ "${BUILD_CUDA_KERNELS}" = "0" ]; then cuda_flag=""; fi \
    && python3 -m src.syncbn.build ${cuda_flag} --cpu-capability "${SYNCBN_CPU_CAPABILITIES}" \
    && find "${SYNCTRAIN_EXTENSIONS_DIR}" \( -name '*.o' -o -name '.ninja_deps' -o -name '.ninja_log' \) -delete \
    && chmod -R a+rwX "${SYNCTRAIN_EXTENSIONS_DIR}" \
    && rm -rf "/tmp/torchinductor_${APP_USER}"

# torchrun, so that `docker run IMAGE <torchrun arguments> train.py <overrides>` is the same command
# line as outside the container. The default: one node, one worker per visible GPU, default job.
ENTRYPOINT ["torchrun"]
CMD ["--standalone", "--nproc_per_node=gpu", "train.py"]
