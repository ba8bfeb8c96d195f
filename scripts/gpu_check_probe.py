"""What scripts/gpu_check.sh needs to know about a Python, in one start: `key=value` lines on stdout.

kind: gpu (a CUDA torch that sees a GPU), nogpu (a CUDA torch, no GPU visible), cpu (a CPU-only torch),
none (no torch); then torch's and CUDA's versions, the GPU, and where Python.h should be (the extension
compiles against it). Never raises: a missing piece is a value the script reports.
"""
from __future__ import annotations

import importlib.util
import sysconfig


def main() -> None:
    """Print the probe's key=value lines."""
    info = {"include": sysconfig.get_paths().get("include", ""),
            "pytest_timeout": int(importlib.util.find_spec("pytest_timeout") is not None)}
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - any failure to import torch means "no usable torch"
        info.update(kind="none", error=type(err).__name__)
    else:
        gpu = torch.cuda.is_available()
        info.update(kind="gpu" if gpu else ("nogpu" if torch.version.cuda else "cpu"), torch=torch.__version__,
                    cuda=torch.version.cuda or "")
        if gpu:
            cap = torch.cuda.get_device_capability(0)
            info.update(gpus=torch.cuda.device_count(), name=torch.cuda.get_device_name(0).replace(" ", "_"),
                        cap=f"{cap[0]}.{cap[1]}")
    for key, value in info.items():
        print(f"{key}={value}")


if __name__ == "__main__":
    main()
