#!/usr/bin/env bash
# What a user does on a fresh machine after installing the README's prerequisites, run inside the
# bare-machine container by tests/docker/test_readme_bare_machine.py: clone, `make train`, `make test-fast`.
#
#   bare_machine_steps.sh COMMIT TRAIN_ARGS TEST_ARGS
#
# The repository to clone is mounted read-only at /src.git, the results folder at /outputs. Each step
# writes its output to /outputs/<step>.log and a "<step> <exit status>" line to /outputs/status; a failed
# step does not stop the next (make test-fast says what fails even when make train did), except a
# failed clone or checkout, after which nothing can run.
set -u

if [[ $# -ne 3 ]]; then
    echo "usage: $0 COMMIT TRAIN_ARGS TEST_ARGS" >&2
    exit 2
fi
commit="$1"
train_args="$2"
test_args="$3"
out=/outputs

step() {
    local name="$1"
    shift
    "$@" > "${out}/${name}.log" 2>&1
    local status=$?
    echo "${name} ${status}" >> "${out}/status"
    return "${status}"
}

# ninja comes only from requirements.txt (into .venv/bin), and make's commands run .venv/bin/... without
# activating the venv: the case where the kernels' build must still find it. Expected to fail here.
step ninja_on_path command -v ninja
# safe.directory: the mounted repository may belong to the host user who ran `sudo make test`.
step clone git -c safe.directory='*' clone --quiet /src.git /root/synctrain || exit 1
cd /root/synctrain || exit 1
step checkout git -c advice.detachedHead=false checkout --quiet --detach "${commit}" || exit 1
step train make train ARGS="${train_args}"
step venv_ninja test -x .venv/bin/ninja
step test_fast make test-fast ARGS="${test_args}"
exit 0
