#!/usr/bin/env bash
# A second environment like the GPU node's Python, for `make test-compat` (docs/gpu.md): the node's PyTorch
# (torch 2.11.0, torchvision 0.26.0; COMPAT_TORCH / COMPAT_TORCHVISION override) on Python 3.12 (the first
# working python3.12 on PATH or in pyenv's versions; none: it stops and says so; COMPAT_PYTHON overrides),
# with the node's share of this project's packages at the versions of the project's environment
# (scripts/gpu_imports.py --node-like), and without what the node lacks (hydra-core, omegaconf, antlr4):
# those come from the gpu-check bundle (.whl), on PYTHONPATH, as on the node.
#
#   bash scripts/compat_env.sh DIR PROJECT_PYTHON
#
# Needs network (PyPI): torch's Linux wheel there is its CUDA build (~530 MB) and loads the CUDA libraries
# (nvidia-*, another ~3 GB) even on a CPU. Their releases are left free: any CUDA 13 release loads on a
# CPU, and pip's cache or a local index may already hold one. Done once: DIR/.installed-<torch>-<vision>-py<X.Y>
# marks a finished environment; a failed attempt leaves none, and the next run starts over.
set -euo pipefail

DIR=${1:?usage: scripts/compat_env.sh DIR PROJECT_PYTHON}
PROJECT_PY=${2:?usage: scripts/compat_env.sh DIR PROJECT_PYTHON}
TORCH=${COMPAT_TORCH:-2.11.0}
VISION=${COMPAT_TORCHVISION:-0.26.0}
cd "$(dirname "$0")/.."

# The node's Python is 3.12: never another one unasked. `python3.12` on PATH can be a shim (pyenv's) that
# answers "command not found" although a 3.12 is installed, so pyenv's own 3.12 installs are tried too.
usable() { "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }
PY=${COMPAT_PYTHON:-}
if [ -n "$PY" ]; then
  "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 \
    || { echo "compat_env: COMPAT_PYTHON=$PY does not run, or lacks its venv module" >&2; exit 1; }
else
  pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
  for cand in "$(command -v python3.12 || true)" "$pyenv_root"/versions/3.12*/bin/python3.12 \
              /usr/local/bin/python3.12 /usr/bin/python3.12; do
    if [ -n "$cand" ] && [ -x "$cand" ] && usable "$cand"; then PY=$cand; break; fi
  done
  if [ -z "$PY" ]; then
    why=$( (python3.12 -V 2>&1 || true) | head -1)
    echo "compat_env: no working Python 3.12 with its venv module (python3.12: ${why:-not found}; looked on PATH," \
         "in $pyenv_root/versions, /usr/local/bin, /usr/bin). The GPU node runs 3.12: install it (Debian/Ubuntu:" \
         "apt-get install python3.12-venv), or set COMPAT_PYTHON to a Python to use instead (e.g. COMPAT_PYTHON=python3)." >&2
    exit 1
  fi
fi
STAMP="$DIR/.installed-$TORCH-$VISION-py$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ -f "$STAMP" ] && exit 0
echo "compat_env: $DIR with $("$PY" -V 2>&1), torch $TORCH, torchvision $VISION"
rm -rf "$DIR"
"$PY" -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install --quiet --disable-pip-version-check)
# PyTorch without its requirements (they pin exact CUDA library releases), then those requirements with the
# CUDA ones unpinned and Triton left out (it compiles GPU kernels only).
"${PIP[@]}" --no-deps "torch==$TORCH" "torchvision==$VISION"
mapfile -t torch_needs < <("$DIR/bin/python" - <<'EOF'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement  # a fresh venv has pip, not packaging
for text in md.requires("torch") or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "triton":
        continue
    cuda = req.name.startswith(("nvidia-", "cuda-"))
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    print(f"{req.name}{extras}" + ("" if cuda else str(req.specifier)))
EOF
)
"${PIP[@]}" "${torch_needs[@]}"
# The node's share of the project's packages, at the project's versions, each without its requirements
# (the list holds them): nothing may replace the PyTorch above.
mapfile -t node_like < <("$PROJECT_PY" scripts/gpu_imports.py --node-like)
"${PIP[@]}" --no-deps "${node_like[@]}"
"$DIR/bin/python" -c "import torch, torchvision; print('compat_env: torch', torch.__version__, 'torchvision', torchvision.__version__)"
touch "$STAMP"
