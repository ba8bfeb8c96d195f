"""Count every read of tensor data by the host in a block of code (on a GPU each would wait for the device).

Two nets, because a read can happen at two levels:
- a TorchDispatchMode sees every operator that reaches the dispatcher, eager or from a compiled graph's runtime:
  `aten._local_scalar_dense` (what .item(), bool(), int() of a tensor come down to), the ops that answer the host
  with a value computed from data (`is_nonzero`, `equal`, `item`), and any operator tagged `cudagraph_unsafe` (an
  operator that says it reads the host inside, which a CUDA graph cannot capture);
- wrappers on torch.Tensor's conversions to Python (`__bool__`, `item`, `tolist`, `__int__`, `__float__`,
  `__index__`, `numpy`, `cpu`, ...) catch a read made where no mode is active, e.g. inside a custom operator's
  Python implementation, which runs with the mode popped.
Each read is recorded with the innermost frames of project code that made it, so a failing test says where.
"""
from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_READING_OPS = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default, aten.equal.default}
_CONVERSIONS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "__complex__", "__format__",
                "__array__", "numpy", "cpu")


def _where() -> str:
    """The innermost frames of this repository's code (src/, tests/ other than this file) that led here."""
    frames = [f for f in traceback.extract_stack()[:-2]
              if ("/src/" in f.filename or "/tests/" in f.filename) and not f.filename.endswith("host_reads.py")]
    return " <- ".join(f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
                       for f in reversed(frames[-3:]))


class _ReadingOps(TorchDispatchMode):
    @classmethod
    def is_infra_mode(cls) -> bool:
        # Dynamo refuses to run compiled code under a user's dispatch mode; an "infra" mode it lets through, so the
        # operators a compiled graph runs pass through this one too.
        return True

    # Compiled graphs wrap mutating operators in higher-order ones (auto_functionalized): look inside those too.
    supports_higher_order_operators = True

    def __init__(self, reads: list[str]) -> None:
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        for op in (func, *args, *kwargs.values()):
            if isinstance(op, torch._ops.OpOverload) and (op in _READING_OPS or torch.Tag.cudagraph_unsafe in op.tags):
                self.reads.append(f"{op} at {_where()}")
        return func(*args, **kwargs)


@contextmanager
def host_reads() -> Iterator[list[str]]:
    """Yields a list that collects one entry per host read of tensor data made inside the block."""
    reads: list[str] = []
    saved = {name: getattr(torch.Tensor, name) for name in _CONVERSIONS if hasattr(torch.Tensor, name)}

    def wrap(name: str, method: Any) -> Any:
        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            reads.append(f"Tensor.{name} at {_where()}")
            return method(self, *args, **kwargs)
        return counted

    for name, method in saved.items():
        setattr(torch.Tensor, name, wrap(name, method))
    try:
        with _ReadingOps(reads):
            yield reads
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
