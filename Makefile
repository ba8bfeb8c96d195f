# `make train` and `make test` are the README's two commands: each sets up the virtual
# environment on first use (or when requirements.txt changes), then does its job.
PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
NPROC    ?= 2
ARGS     ?=
# What `make test` runs before the suite (the system packages some parts' tests need, below).
TEST_PREREQUISITES :=

.PHONY: setup train test test-fast build-ext clean

setup: $(VENV)/.installed

# A fresh Debian/Ubuntu machine has python3 without its venv module (and ensurepip): say which package
# to install instead of leaving the user a traceback. The same for the headers the extension compiles against.
$(VENV)/.installed: requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 (Debian/Ubuntu: apt-get install python3)" >&2; exit 1; }
	@V=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	 $(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { echo "$(PYTHON) $$V cannot create a virtual environment (no venv/ensurepip module): install python$$V-venv (Debian/Ubuntu: apt-get install python$$V-venv, or python3-venv when python3 is $$V), then run make again" >&2; exit 1; }; \
	 $(PYTHON) -c 'import sysconfig, os, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_path("include", scheme="posix_prefix"), "Python.h")))' || echo "note: the Python $$V headers (Python.h) are missing; the SyncBN extension will not build until you install python$$V-dev (Debian/Ubuntu; python3-dev when python3 is $$V)" >&2
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r requirements.txt
	touch $@

# part: slurm, docker
# The Debian packages the cluster tests need (scripts/install_system_deps.sh lists them): installed as root,
# skipped (with a note) otherwise.
.PHONY: system-deps
system-deps:
	@scripts/install_system_deps.sh
TEST_PREREQUISITES += system-deps
# /part

build-ext: setup
	$(PY) -m src.syncbn.build

train: setup
	SYNCTRAIN_MAKE_TARGET=train $(VENV)/bin/torchrun --standalone --nproc_per_node=$(NPROC) train.py $(ARGS)

# The suite runs on TEST_WORKERS pytest-xdist workers, one test file (or the docker / cluster folder, whose
# tests share minutes-long fixtures) at a time each; TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
PYTEST   := $(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)

test: setup $(TEST_PREREQUISITES)
	$(PYTEST) $(ARGS)

# The inner loop: every unit and layer test, without the torchrun, docker and SLURM ones.
test-fast: setup
	$(PYTEST) -m "not slow and not docker and not slurm" $(ARGS)

# part: gpu-tools
# GPU validation on a machine with an NVIDIA GPU (docs/gpu.md): build, self-check, `cuda` tests, NCCL training
# compare; then, time permitting, occupancy, compute-sanitizer, the exchange's host cost, benchmarks; report in
# OUT (default outputs/gpu_check): report.json, summary.txt, logs.tar.gz. Carry .whl (make gpu-bundle) to a node
# without network, and allow the command about 450 s.
# No `setup` prerequisite: the script finds a Python whose torch sees the GPU itself.
.PHONY: gpu-check gpu-bundle test-compat
OUT ?= outputs/gpu_check
gpu-check:
	bash scripts/gpu_check.sh $(OUT)

# The wheels an offline GPU node lacks for gpu-check (scripts/gpu_imports.py reads them off the imports; the
# node's list: scripts/gpu_node_packages.txt or NODE_PACKAGES=FILE, its `pip list --format=freeze`), into .whl
# with a size report (with the repository, under 64 MiB). Needs network.
NODE_PACKAGES ?=
gpu-bundle: setup
	$(PY) scripts/gpu_bundle.py --out .whl $(if $(NODE_PACKAGES),--node-packages $(NODE_PACKAGES))

# The files gpu-check runs, and the kernel, layer, process-group and gpu-check tests, on the CPU with the GPU
# node's PyTorch (torch 2.11 / torchvision 0.26 on Python 3.12: scripts/compat_env.sh) in a second environment,
# COMPAT_VENV, and the bundle on PYTHONPATH as on the node; first it rewrites tests/oldest_torch_api.txt, the
# snapshot of that PyTorch's names that `make test` checks the code against. Not part of `make test`: the
# first run downloads ~4 GB (PyTorch's CUDA build and its libraries) and compiles the CUDA kernels against
# that PyTorch (minutes on 2 cores).
COMPAT_VENV ?= .venv-compat
COMPAT_TESTS := tests/syncbn/test_kernels.py tests/syncbn/test_simt.py tests/syncbn/test_cuda_launches.py \
	tests/syncbn/test_selfcheck_ranks.py tests/syncbn/test_emulated_syncbn.py tests/syncbn/test_fusable.py tests/syncbn/test_cuda_build.py \
	tests/syncbn/test_occupancy_model.py tests/data/test_replay.py tests/test_gpu_check_script.py tests/test_gpu_bundle.py \
	tests/test_process_group.py tests/test_gloo_harness.py tests/engine/test_wrap.py
test-compat: gpu-bundle
	bash scripts/compat_env.sh $(COMPAT_VENV) $(PY)
	$(COMPAT_VENV)/bin/python scripts/torch_api_names.py --write tests/oldest_torch_api.txt
	rm -rf $(COMPAT_VENV)/bundle
	$(COMPAT_VENV)/bin/python -m pip install -q --no-index --no-deps --target $(COMPAT_VENV)/bundle .whl/*.whl
	SYNCTRAIN_EXTENSIONS_DIR=$(abspath $(COMPAT_VENV))/torch_extensions PYTHONPATH=$(abspath $(COMPAT_VENV))/bundle \
	  $(COMPAT_VENV)/bin/python -m pytest -p no:cacheprovider $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup) \
	  $$(awk '$$1 ~ /_tests$$/ { print $$2 }' scripts/gpu_check_tests.txt) $(COMPAT_TESTS) $(ARGS)
# /part

# Build caches only: outputs/ holds your runs (checkpoints, logs) and is never deleted here.
clean:
	rm -rf build .cache .pytest_cache
# part: template

# Your own project from this template, with only the parts you choose (docs/new-project.md), e.g.
#   make new-project DEST=../roads NAME="Road segmentation" ARGS="--tasks classification,segmentation"
# No `setup` prerequisite: the generator needs Python 3.11 and git only.
.PHONY: new-project
new-project:
	@test -n "$(DEST)" && test -n "$(NAME)" || { echo 'usage: make new-project DEST=folder NAME="Project name" [ARGS="--full"]' >&2; exit 2; }
	$(PYTHON) scripts/new_project.py "$(DEST)" --name "$(NAME)" $(ARGS)
# /part
