# `make train` and `make test` are the README's two commands: each sets up the virtual
# environment on first use (or when requirements.txt changes), then does its job.
PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
NPROC    ?= 2
ARGS     ?=

.PHONY: setup system-deps train test test-fast build-ext gpu-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r requirements.txt
	touch $@

# Debian packages for the SLURM tests (slurm-wlm, munge): installed as root, skipped (with a note) otherwise.
system-deps:
	@scripts/install_system_deps.sh

build-ext: setup
	$(PY) -m src.syncbn.build

train: setup
	$(VENV)/bin/torchrun --standalone --nproc_per_node=$(NPROC) train.py $(ARGS)

test: setup system-deps
	$(PY) -m pytest $(ARGS)

test-fast: setup
	$(PY) -m pytest -m "not slow" $(ARGS)

# GPU validation on a machine with an NVIDIA GPU (docs/gpu.md): build, self-check, `cuda` tests,
# compute-sanitizer, NCCL training compare, benchmark, occupancy; report in OUT (default outputs/gpu_check).
# No `setup` prerequisite: the script finds a Python whose torch sees the GPU itself.
OUT ?= outputs/gpu_check
gpu-check:
	bash scripts/gpu_check.sh $(OUT)

clean:
	rm -rf build .cache outputs .pytest_cache
