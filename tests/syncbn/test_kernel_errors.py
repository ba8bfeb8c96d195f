"""The CPU and the CUDA kernels raise the same error, word for word, for the same bad input (csrc/checks.h).

The CUDA kernels run emulated on the CPU in every `make test` (and on a GPU where there is one, with the
inputs moved there), so the very same tensors go to both backends. Every check also holds for empty
batches: the ops check their arguments before they return early.

Two checks look at values, which a CUDA op cannot read without synchronising with the device: a negative
count in the gathered rows and num_batches_tracked <= 0. The CPU op raises for them; the CUDA op returns
NaN where the bad value would have gone, so the mistake is not silent either (test at the end).
"""
from __future__ import annotations

import re

import pytest
import torch

from src.syncbn.extension import load_extension
from tests.syncbn.cuda_cases import BACKENDS, load_backend, one_intraop_thread

CL = torch.channels_last


@pytest.fixture(scope="module", params=BACKENDS)
def kb(request):
    """The CUDA kernels (emulated under each schedule, or on a GPU); torch's CPU ops on one thread."""
    backend = load_backend(request.param)
    with one_intraop_thread():
        yield backend
    backend.release()


@pytest.fixture(scope="module")
def cpu_ops():
    return load_extension()


def x3(n=2, c=3, length=4):
    return torch.randn(n, c, length)


def stats_rows(c=3, rows=2, count=4.0):
    """Valid float64 [rows, 2c+1] gathered statistics."""
    g = torch.rand(rows, 2 * c + 1, dtype=torch.float64) + 0.5
    g[:, 0] = count
    return g


# name -> (op, arguments builder, what the message must say)
CASES = {
    "stats_1d": ("batch_norm_stats", lambda: (torch.randn(5),), "at least 2 dims"),
    "stats_int": ("batch_norm_stats", lambda: (torch.arange(6).view(2, 3),), "dtype Long is not supported"),
    "stats_strided": ("batch_norm_stats", lambda: (torch.randn(2, 3, 4, 5).transpose(2, 3),),
                      "neither contiguous nor channels_last"),
    "stats_3d_transposed": ("batch_norm_stats", lambda: (torch.randn(2, 7, 3).transpose(1, 2),),
                            "neither contiguous nor channels_last"),
    "elemt_mean_size": ("batch_norm_elemt", lambda: (x3(), None, None, torch.zeros(4), torch.ones(3)),
                        "mean must be a 1-D tensor of 3 values"),
    "elemt_mean_2d": ("batch_norm_elemt", lambda: (x3(), None, None, torch.zeros(1, 3), torch.ones(3)),
                      "mean must be a 1-D tensor of 3 values"),
    "elemt_invstd_int": ("batch_norm_elemt", lambda: (x3(), None, None, torch.zeros(3), torch.ones(3, dtype=torch.long)),
                         "invstd must be floating point"),
    "elemt_weight_size": ("batch_norm_elemt", lambda: (x3(), torch.ones(2), None, torch.zeros(3), torch.ones(3)),
                          "weight must be a 1-D tensor of 3 values"),
    "elemt_bias_size": ("batch_norm_elemt", lambda: (x3(), None, torch.ones(5), torch.zeros(3), torch.ones(3)),
                        "bias must be a 1-D tensor of 3 values"),
    "elemt_empty_mean_size": ("batch_norm_elemt", lambda: (x3(n=0), None, None, torch.zeros(4), torch.ones(3)),
                              "mean must be a 1-D tensor of 3 values"),
    "bwd_reduce_dy_dtype": ("batch_norm_backward_reduce", lambda: (x3().double(), x3(), torch.zeros(3), torch.ones(3)),
                            "does not match input dtype"),
    "bwd_reduce_dy_format": ("batch_norm_backward_reduce",
                             lambda: (torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4).contiguous(memory_format=CL),
                                      torch.zeros(3), torch.ones(3)), "must have the input's memory format"),
    "bwd_reduce_dy_shape": ("batch_norm_backward_reduce", lambda: (x3(length=5), x3(), torch.zeros(3), torch.ones(3)),
                            "grad_out has shape"),
    "bwd_reduce_empty_invstd_size": ("batch_norm_backward_reduce",
                                     lambda: (x3(n=0), x3(n=0), torch.zeros(3), torch.ones(2)),
                                     "invstd must be a 1-D tensor of 3 values"),
    "bwd_elemt_reduced_size": ("batch_norm_backward_elemt",
                               lambda: (x3(), x3(), torch.zeros(3), torch.ones(3), None, torch.zeros(5), torch.tensor(8.0)),
                               "reduced must be a 1-D tensor of 6 values"),
    "bwd_elemt_count_size": ("batch_norm_backward_elemt",
                             lambda: (x3(), x3(), torch.zeros(3), torch.ones(3), None, torch.zeros(6), torch.ones(2)),
                             "count must be a tensor holding one value"),
    "bwd_elemt_weight_size": ("batch_norm_backward_elemt",
                              lambda: (x3(), x3(), torch.zeros(3), torch.ones(3), torch.ones(4), torch.zeros(6),
                                       torch.tensor(8.0)), "weight must be a 1-D tensor of 3 values"),
    "bwd_elemt_empty_reduced_size": ("batch_norm_backward_elemt",
                                     lambda: (x3(n=0), x3(n=0), torch.zeros(3), torch.ones(3), None, torch.zeros(3),
                                              torch.tensor(0.0)), "reduced must be a 1-D tensor of 6 values"),
    "gather_shape": ("batch_norm_gather_stats",
                     lambda: (torch.zeros(2, 6, dtype=torch.float64), None, None, None, 0.1, 1e-5, False),
                     r"\[world_size, 2\*C\+1\]"),
    "gather_float32": ("batch_norm_gather_stats", lambda: (stats_rows().float(), None, None, None, 0.1, 1e-5, False),
                       "gathered must be float64, got Float"),
    "gather_running_mean_only": ("batch_norm_gather_stats",
                                 lambda: (stats_rows(), torch.zeros(3), None, None, 0.1, 1e-5, False),
                                 "running_mean and running_var must be given together"),
    "gather_running_size": ("batch_norm_gather_stats",
                            lambda: (stats_rows(), torch.zeros(4), torch.ones(4), None, 0.1, 1e-5, False),
                            "running_mean must be a 1-D tensor of 3 values"),
    "gather_running_2d": ("batch_norm_gather_stats",
                          lambda: (stats_rows(), torch.zeros(1, 3), torch.ones(1, 3), None, 0.1, 1e-5, False),
                          "running_mean must be a 1-D tensor of 3 values"),
    "gather_running_dtypes": ("batch_norm_gather_stats",
                              lambda: (stats_rows(), torch.zeros(3), torch.ones(3).double(), None, 0.1, 1e-5, False),
                              "must share a dtype, got Float and Double"),
    "gather_running_strided": ("batch_norm_gather_stats",
                               lambda: (stats_rows(), torch.zeros(6)[::2], torch.ones(3), None, 0.1, 1e-5, False),
                               "must be contiguous"),
    "gather_cumulative_without_nbt": ("batch_norm_gather_stats",
                                      lambda: (stats_rows(), torch.zeros(3), torch.ones(3), None, -1.0, 1e-5, False),
                                      "needs num_batches_tracked"),
    "gather_nbt_float": ("batch_norm_gather_stats",
                         lambda: (stats_rows(), torch.zeros(3), torch.ones(3), torch.tensor(2.0), -1.0, 1e-5, False),
                         "num_batches_tracked must be a one-element int64 tensor"),
    "gather_nbt_two_values": ("batch_norm_gather_stats",
                              lambda: (stats_rows(), torch.zeros(3), torch.ones(3), torch.tensor([1, 2]), -1.0, 1e-5,
                                       False), "num_batches_tracked must be a one-element int64 tensor"),
    "gather_all_empty_running_size": ("batch_norm_gather_stats",
                                      lambda: (stats_rows(count=0.0), torch.zeros(4), torch.ones(4), None, 0.1, 1e-5,
                                               False), "running_mean must be a 1-D tensor of 3 values"),
}


def message(exc: BaseException, device: str) -> str:
    """The error's text without C++ frames, with the device named as on the CPU."""
    text = str(exc).split("\nException raised from")[0]
    return re.sub(r"cuda(:\d+)?", "cpu", text) if device == "cuda" else text


def moved(args, device: str):
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("name", list(CASES))
def test_same_error_from_both_backends(kb, cpu_ops, name):
    op, build, expected = CASES[name]
    args = build()
    with pytest.raises(RuntimeError, match=expected) as on_cpu:
        getattr(cpu_ops, op)(*args)
    with pytest.raises(RuntimeError, match=expected) as on_cuda:
        getattr(kb.ops, op)(*moved(args, kb.device))
    assert message(on_cuda.value, kb.device) == message(on_cpu.value, "cpu")


def test_value_checks_cpu_raises_cuda_gives_nan(kb, cpu_ops):
    """Negative counts and num_batches_tracked <= 0: an error on the CPU, NaN (never plausible) on CUDA."""
    rows = stats_rows()
    rows[1, 0] = -4.0
    rm, rv = torch.zeros(3), torch.ones(3)
    with pytest.raises(RuntimeError, match="row 1 has count -4; counts must be >= 0"):
        cpu_ops.batch_norm_gather_stats(rows, rm.clone(), rv.clone(), None, 0.1, 1e-5, False)
    d_rm, d_rv = rm.to(kb.device), rv.to(kb.device)
    mean, invstd, count = kb.ops.batch_norm_gather_stats(rows.to(kb.device), d_rm, d_rv, None, 0.1, 1e-5, False)
    assert mean.isnan().all() and invstd.isnan().all() and count.isnan()
    assert torch.equal(d_rm.cpu(), rm) and torch.equal(d_rv.cpu(), rv)  # running stats left alone

    nbt = torch.tensor(0)
    with pytest.raises(RuntimeError, match="num_batches_tracked must be >= 1"):
        cpu_ops.batch_norm_gather_stats(stats_rows(), rm.clone(), rv.clone(), nbt, -1.0, 1e-5, False)
    mean, invstd, _ = kb.ops.batch_norm_gather_stats(stats_rows().to(kb.device), d_rm, d_rv, nbt.to(kb.device), -1.0,
                                                     1e-5, False)
    assert not mean.isnan().any() and not invstd.isnan().any()  # the batch statistics are fine
    assert d_rm.isnan().all() and d_rv.isnan().all()
