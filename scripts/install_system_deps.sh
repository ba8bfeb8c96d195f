#!/usr/bin/env bash
# System packages the test suite uses besides Python's. `make test` runs this first.
# part: slurm
# Debian's slurm-wlm and munge, for the one-node SLURM cluster that tests/cluster/test_slurm.py starts.
# /part
# part: docker
# buildah and debootstrap, with which tests/docker/ makes a Debian base image and builds and runs the
# Dockerfile (no Docker daemon needed).
# /part
#
#   scripts/install_system_deps.sh
#
# Quick and silent when they are installed. As root with apt-get, installs them (apt-get update only
# when the install needs it). Otherwise, or when the install fails, it says so and exits 0: the tests
# that need them then skip with a reason that names what is missing, and the rest of the suite runs
# as usual.
set -uo pipefail
PATH="${PATH}:/usr/sbin:/sbin"  # where Debian puts the daemons; a user's PATH may lack them

tools=()
packages=()
# part: slurm
tools+=(munged slurmctld slurmd sbatch scontrol)
packages+=(slurm-wlm munge)
# /part
# part: docker
tools+=(buildah debootstrap)
packages+=(buildah debootstrap)
# /part

missing=()
for tool in "${tools[@]}"; do
    command -v "${tool}" > /dev/null 2>&1 || missing+=("${tool}")
done
if [[ "${#missing[@]}" -eq 0 ]]; then
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get > /dev/null 2>&1; then
    echo "install_system_deps.sh: ${missing[*]} not found and not root with apt-get: the tests that need" \
        "them will skip (to run them: apt-get install ${packages[*]}, as root)" >&2
    exit 0
fi

log="$(mktemp)"
export DEBIAN_FRONTEND=noninteractive
echo "install_system_deps.sh: installing ${packages[*]} for the tests that need them" >&2
if ! apt-get install -y --no-install-recommends "${packages[@]}" > "${log}" 2>&1; then
    # A fresh machine may have no (or stale) package lists.
    if ! { apt-get update && apt-get install -y --no-install-recommends "${packages[@]}"; } > "${log}" 2>&1; then
        echo "install_system_deps.sh: apt-get install ${packages[*]} failed; the tests that need them will skip:" >&2
        tail -n 20 "${log}" >&2
    fi
fi
rm -f "${log}"
exit 0
