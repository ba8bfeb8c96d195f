"""The kernels as PyTorch operators: schemas, fake implementations, and what torch.compile needs of them.

torch.library.opcheck runs each op for real and under FakeTensor / AOT dispatch (static and dynamic
shapes) and checks that the fake implementation's outputs (shape, dtype, strides, device) match the
kernel's, and that the schema's mutation annotations match what the kernel really writes.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from src.syncbn import SyncBatchNorm1d, SyncBatchNorm2d, functions
from src.syncbn.extension import load_extension
from src.syncbn.fake_kernels import OP_NAMES

# torch.library.opcheck imports torch.testing._internal, which freezes torch.backends' flags for the process.
pytestmark = pytest.mark.usefixtures("restores_backend_flags")

FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


@pytest.fixture(scope="module")
def ops() -> functions.KernelOps:
    return functions.kernel_ops()


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype)
    dy = torch.randn(shape, generator=gen).to(dtype)
    if fmt != "contiguous":
        x, dy = x.contiguous(memory_format=FORMATS[fmt]), dy.contiguous(memory_format=FORMATS[fmt])
    return x, dy


CASES = {
    "2d_float32": ((6, 5), torch.float32, "contiguous"),
    "3d_float64": ((3, 4, 7), torch.float64, "contiguous"),
    "4d_bfloat16": ((2, 3, 4, 5), torch.bfloat16, "contiguous"),
    "4d_float32_channels_last": ((2, 3, 4, 5), torch.float32, "channels_last"),
    "4d_float16_channels_last": ((3, 4, 2, 3), torch.float16, "channels_last"),
    "empty_batch": ((0, 3, 4, 4), torch.float32, "contiguous"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(ops: functions.KernelOps, case: str) -> None:
    shape, dtype, fmt = CASES[case]
    x, dy = _inputs(shape, dtype, fmt)
    c = shape[1]
    w, b = torch.rand(c) + 0.5, torch.randn(c)
    local = ops.batch_norm_stats(x)
    gathered = torch.stack([local, ops.batch_norm_stats(torch.randn(4, *shape[1:]).to(dtype))])
    acc_double = dtype == torch.float64
    rm, rv, nbt = torch.zeros(c, dtype=w.dtype), torch.ones(c, dtype=w.dtype), torch.tensor(3)
    mean, invstd, count = ops.batch_norm_gather_stats(gathered, None, None, None, 0.1, 1e-5, acc_double)
    reduced = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
    sums = ops.batch_norm_mean_sums(gathered[0]) + ops.batch_norm_mean_sums(gathered[1])  # the first all_reduce
    m2 = ops.batch_norm_deviation_sums(gathered[0], sums) + ops.batch_norm_deviation_sums(gathered[1], sums)
    checks = [
        (ops.batch_norm_stats, (x,)),
        (ops.batch_norm_mean_sums, (local,)),
        (ops.batch_norm_deviation_sums, (local, sums)),
        (ops.batch_norm_reduced_stats, (sums, m2, rm, rv, nbt, 0.1, 1e-5, acc_double)),
        (ops.batch_norm_reduced_stats, (sums, m2, rm, rv, nbt, -1.0, 1e-5, acc_double)),  # cumulative average
        (ops.batch_norm_reduced_stats, (sums, m2, None, None, None, 0.1, 1e-5, acc_double)),
        (ops.batch_norm_gather_stats, (gathered, rm, rv, nbt, 0.1, 1e-5, acc_double)),
        (ops.batch_norm_gather_stats, (gathered, rm, rv, nbt, -1.0, 1e-5, acc_double)),  # cumulative average
        (ops.batch_norm_gather_stats, (gathered, None, None, None, 0.1, 1e-5, acc_double)),
        (ops.batch_norm_elemt, (x, w, b, mean, invstd)),
        (ops.batch_norm_elemt, (x, None, None, mean, invstd)),
        (ops.batch_norm_backward_reduce, (dy, x, mean, invstd)),
        (ops.batch_norm_backward_elemt, (dy, x, mean, invstd, w, reduced, count)),
        (ops.batch_norm_backward_elemt, (dy, x, mean, invstd, None, reduced, count)),
    ]
    for op, args in checks:
        torch.library.opcheck(op, args)


def test_one_value_check_is_an_operator() -> None:
    # Rows of [count, mean, M2] for C = 1: 2 values in the group pass, 1 value raises.
    rows = torch.tensor([[2.0, 0.5, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.library.opcheck(functions._require_more_than_one_value, (rows, [2, 1], 2))
    one = torch.tensor([[1.0, 0.5, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        functions._require_more_than_one_value(one, [1, 1], 2)
    # The all_reduce exchange's [N, sum n*mean]: the same check on its one row.
    torch.library.opcheck(functions._require_more_than_one_value, (torch.tensor([2.0, 1.0], dtype=torch.float64),
                                                                  [2, 1], 2))
    with pytest.raises(ValueError, match="1 value per channel in the whole group of 2"):
        functions._require_more_than_one_value(torch.tensor([1.0, 0.5], dtype=torch.float64), [1, 1], 2)


def test_only_the_running_statistics_are_declared_mutable(ops: functions.KernelOps) -> None:
    written = {
        name: [a.name for a in getattr(ops, name)._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        for name in OP_NAMES
    }
    assert written == {"batch_norm_stats": [], "batch_norm_gather_stats": ["running_mean", "running_var"],
                       "batch_norm_mean_sums": [], "batch_norm_deviation_sums": [],
                       "batch_norm_reduced_stats": ["running_mean", "running_var"], "batch_norm_elemt": [],
                       "batch_norm_backward_reduce": [], "batch_norm_backward_elemt": []}


def test_ops_live_in_the_loaded_variants_namespace(ops: functions.KernelOps) -> None:
    module = load_extension()
    assert ops.traceable and ops.library == module.__file__
    for name in OP_NAMES:
        assert getattr(ops, name) is getattr(getattr(torch.ops, module.ops_namespace), name).default


def test_first_use_inside_torch_compile_loads_the_kernels() -> None:
    saved = functions.kernel_ops()
    functions._OPS = None  # as in a fresh process whose first SyncBN call is a compiled one
    try:
        torch._dynamo.reset()
        x = torch.randn(2, 3, 4, 4)
        y = torch.compile(SyncBatchNorm2d(3), fullgraph=True, backend="eager")(x)
        assert functions._OPS is not None and functions._OPS.traceable
        torch.testing.assert_close(y, torch.nn.functional.batch_norm(x, None, None, training=True))
    finally:
        functions._OPS = saved


def test_eager_only_kernels_fail_clearly_under_compile() -> None:
    module = load_extension()
    python_bound = SimpleNamespace(**{name: getattr(module, name) for name in OP_NAMES}, __file__="emulated.so")
    saved = functions.kernel_ops()
    try:
        functions.use_kernel_module(python_bound)  # type: ignore[arg-type]
        layer = SyncBatchNorm1d(3)
        x = torch.randn(4, 3)
        torch.testing.assert_close(layer(x), torch.nn.functional.batch_norm(x, None, None, training=True))
        torch._dynamo.reset()
        with pytest.raises(Exception, match="torch.compile cannot trace"):
            torch.compile(SyncBatchNorm1d(3), fullgraph=True, backend="eager")(x)
    finally:
        functions._OPS = saved


def test_one_value_per_channel_raises_valueerror_from_compiled_code() -> None:
    torch._dynamo.reset()
    layer = torch.compile(SyncBatchNorm1d(3), fullgraph=True, backend="aot_eager")
    layer(torch.randn(4, 3))  # a normal batch compiles without the check
    with pytest.raises(ValueError, match=r"Expected more than 1 value per channel when training, got input size "
                                         r"torch.Size\(\[1, 3\]\)"):
        layer(torch.randn(1, 3))
