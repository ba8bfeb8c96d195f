"""One process, no process group: our layers are plain batch norm (our kernels, no communication).

Agreement with nn.BatchNormXd on PyTorch's own sample inputs for BatchNorm1d/2d/3d, constructor and
state_dict parity, eval mode, layouts, low precision, empty batches.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn

from src.syncbn import SyncBatchNorm, SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d, collectives
from src.syncbn.functions import kernel_memory_format
from tests.syncbn.equivalence_cases import BATCHNORM_TAKES_BIAS

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
PAIRS = [(SyncBatchNorm1d, nn.BatchNorm1d), (SyncBatchNorm2d, nn.BatchNorm2d), (SyncBatchNorm3d, nn.BatchNorm3d)]

# PyTorch's module_db sample inputs for BatchNorm1d/2d/3d (torch/testing/_internal/common_modules.py,
# module_inputs_torch_nn_BatchNorm{1,2,3}d): (constructor args, constructor kwargs, input shape, desc).
# Transcribed because importing module_db needs `expecttest`, which is not a dependency of this project;
# when it is importable, test_module_db_is_transcribed_faithfully checks this copy against it.
TORCH_SAMPLES = {
    nn.BatchNorm1d: [
        ((10,), {}, (4, 10), "affine"), ((5,), {}, (4, 5, 3), "3d_input"),
        ((10, 1e-3, None), {}, (4, 10), "affine_simple_average"), ((10, 1e-3, 0.3, False), {}, (4, 10), "not_affine"),
        ((10, 1e-3, 0.3, True, False), {}, (4, 10), "not_tracking_stats"),
        ((5, 1e-3, 0.3, False), {}, (4, 5, 3), "3d_input_not_affine"), ((5, 1e-3, 0.3, False), {}, (0, 5, 9), "zero_batch"),
        ((10,), {"bias": False}, (4, 10), "affine_not_bias"),
    ],
    nn.BatchNorm2d: [
        ((3,), {}, (2, 3, 6, 6), ""), ((3, 1e-3, None), {}, (2, 3, 6, 6), "2d_simple_average"),
        ((3, 1e-3, 0.8), {}, (2, 3, 6, 6), "momentum"), ((3, 1e-3, 0.8, False), {}, (2, 3, 6, 6), "not_affine"),
        ((3, 1e-3, 0.8, True, False), {}, (2, 3, 6, 6), "not_tracking_stats"),
        ((5, 1e-3, 0.3, False), {}, (0, 5, 2, 2), "zero_batch"), ((3,), {"bias": False}, (2, 3, 6, 6), "affine_not_bias"),
    ],
    nn.BatchNorm3d: [
        ((3,), {}, (2, 3, 4, 4, 4), ""), ((3, 1e-3, None), {}, (2, 3, 4, 4, 4), "3d_simple_average"),
        ((3, 1e-3, 0.7), {}, (2, 3, 4, 4, 4), "momentum"), ((3, 1e-3, 0.7, False), {}, (2, 3, 4, 4, 4), "not_affine"),
        ((3, 1e-3, 0.7, True, False), {}, (2, 3, 4, 4, 4), "not_tracking_stats"),
        ((5, 1e-3, 0.3, False), {}, (0, 5, 2, 2, 2), "zero_batch"), ((3,), {"bias": False}, (2, 3, 4, 4, 4), "affine_not_bias"),
    ],
}
SYNC_OF = {nn.BatchNorm1d: SyncBatchNorm1d, nn.BatchNorm2d: SyncBatchNorm2d, nn.BatchNorm3d: SyncBatchNorm3d}
NEEDS_BIAS_ARG = pytest.mark.skipif(not BATCHNORM_TAKES_BIAS, reason=f"nn.BatchNorm of torch {torch.__version__} "
                                    "has no bias= to compare with")
SAMPLES = [pytest.param(ref, args, kw, shape, id=f"{ref.__name__}-{desc or 'default'}",
                        marks=[NEEDS_BIAS_ARG] if "bias" in kw else [])
           for ref, rows in TORCH_SAMPLES.items() for args, kw, shape, desc in rows]
# float32 vs PyTorch's own float32 kernels: both accumulate in fp32 over <= 200 values per channel,
# in different orders -> differences of a few ulp of O(1) results.
F32_TOL = dict(atol=1e-5, rtol=1e-5)


def _pair(ref_cls: type, args: tuple, kwargs: dict, device: str, dtype: torch.dtype = torch.float32) -> tuple:
    torch.manual_seed(0)
    ours = SYNC_OF.get(ref_cls, ref_cls)(*args, **kwargs, device=device, dtype=dtype)
    ref = ref_cls(*args, **kwargs, device=device, dtype=dtype)
    with torch.no_grad():
        for p in ours.parameters():  # non-trivial affine parameters, same in both
            p.uniform_(0.5, 1.5)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _assert_same_step(ours: nn.Module, ref: nn.Module, x: torch.Tensor, tol: dict) -> None:
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), ref(xb)
    g = torch.randn_like(yb)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(ya, yb, **tol)
    torch.testing.assert_close(xa.grad, xb.grad, **tol)
    for (name, pa), (_, pb) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, **tol, msg=lambda m: f"{name}.grad: {m}")
    for (name, ba), (_, bb) in zip(ours.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(ba, bb, **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ref_cls,args,kwargs,shape", SAMPLES)
def test_torch_sample_inputs_train_then_eval(ref_cls: type, args: tuple, kwargs: dict, shape: tuple, device: str) -> None:
    ours, ref = _pair(ref_cls, args, kwargs, device)
    for step in range(3):  # several steps: running stats and momentum=None's cumulative average
        _assert_same_step(ours, ref, torch.randn(shape, device=device) * (step + 1) + step, F32_TOL)
    ours.eval()
    ref.eval()
    _assert_same_step(ours, ref, torch.randn(shape, device=device), F32_TOL)


@pytest.mark.usefixtures("restores_backend_flags")  # importing module_db freezes torch.backends' flags
def test_module_db_is_transcribed_faithfully() -> None:
    common_modules = pytest.importorskip("torch.testing._internal.common_modules", exc_type=ImportError)
    for info in common_modules.module_db:
        if info.module_cls in TORCH_SAMPLES:
            got = [
                (s.constructor_input.args, s.constructor_input.kwargs, tuple(s.forward_input.args[0].shape))
                for s in info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=False, training=True)
            ]
            assert got == [row[:3] for row in TORCH_SAMPLES[info.module_cls] if BATCHNORM_TAKES_BIAS or "bias" not in row[1]]


def test_constructor_matches_installed_sync_batchnorm() -> None:
    """Our constructor is nn.SyncBatchNorm's (with bias=, which PyTorch 2.11's lacks: test_bias_false_...)."""
    ours = inspect.signature(SyncBatchNorm.__init__).parameters
    theirs = inspect.signature(nn.SyncBatchNorm.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values() if p.name in theirs or p.name != "bias"] == [
        (p.name, p.kind, p.default) for p in theirs.values()]
    for cls in (SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d):
        assert issubclass(cls, torch.nn.modules.batchnorm._BatchNorm)


@pytest.mark.parametrize("kwargs", [{}, {"affine": False}, pytest.param({"bias": False}, marks=NEEDS_BIAS_ARG),
                                    {"track_running_stats": False}])
def test_parameters_buffers_state_dict_match_batchnorm(kwargs: dict) -> None:
    ours, ref = SyncBatchNorm2d(6, **kwargs), nn.BatchNorm2d(6, **kwargs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in ref.named_buffers()]
    assert list(ours.state_dict()) == list(ref.state_dict())
    ref.load_state_dict(ours.state_dict())  # checkpoints move both ways, strict
    ours.load_state_dict(ref.state_dict())
    assert repr(ours).startswith("SyncBatchNorm2d(6, eps=1e-05")


def test_bias_false_needs_a_pytorch_that_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where nn.BatchNorm has no bias= (PyTorch 2.11), bias=False is refused saying so; bias=True works."""
    from src.syncbn import modules

    monkeypatch.setattr(modules, "_BATCHNORM_TAKES_BIAS", False)
    with pytest.raises(ValueError, match=r"SyncBatchNorm2d\(bias=False\) needs a PyTorch whose nn.BatchNorm takes bias="):
        SyncBatchNorm2d(4, bias=False)
    if not BATCHNORM_TAKES_BIAS:  # the installed PyTorch is such a one: the layer is built without passing it on
        assert SyncBatchNorm2d(4, bias=True).bias is not None


def test_dtype_and_device_arguments() -> None:
    m = SyncBatchNorm(4, dtype=torch.float64, device="cpu")
    assert m.weight.dtype == m.running_mean.dtype == torch.float64
    assert m.num_batches_tracked.dtype == torch.long


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 7), (2, 3, 4, 5), (2, 3, 2, 3, 4)])
def test_generic_layer_takes_2d_to_5d_in_float64(shape: tuple, device: str) -> None:
    ref_cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[len(shape)]
    ours, ref = _pair(ref_cls, (3,), {"momentum": None}, device, torch.float64)
    ours = SyncBatchNorm(3, momentum=None, device=device, dtype=torch.float64)
    ours.load_state_dict(ref.state_dict())
    for _ in range(2):
        _assert_same_step(ours, ref, torch.randn(shape, device=device, dtype=torch.float64) + 3, dict(atol=1e-12, rtol=1e-12))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,shape", [(torch.channels_last, (2, 5, 4, 3)), (torch.channels_last_3d, (2, 4, 3, 2, 3))])
def test_channels_last_kept_without_copy(fmt: torch.memory_format, shape: tuple, device: str) -> None:
    ref_cls = nn.BatchNorm2d if len(shape) == 4 else nn.BatchNorm3d
    ours, ref = _pair(ref_cls, (shape[1],), {}, device)
    x = torch.randn(shape, device=device).contiguous(memory_format=fmt)
    assert kernel_memory_format(x) == fmt  # the kernels take it as is: no hidden .contiguous()
    _assert_same_step(ours, ref, x, F32_TOL)
    xa = x.clone().requires_grad_()
    y = ours(xa)
    y.backward(torch.randn_like(y).contiguous())  # a contiguous grad is brought to x's layout
    assert y.is_contiguous(memory_format=fmt) and xa.grad.is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("device", DEVICES)
def test_non_standard_strides(device: str) -> None:
    ours, ref = _pair(nn.BatchNorm2d, (3,), {}, device)
    base = torch.randn(2, 6, 5, 4, device=device)
    _assert_same_step(ours, ref, base[:, ::2], F32_TOL)  # every other channel
    _assert_same_step(ours, ref, base.transpose(2, 3)[:, :3], F32_TOL)  # permuted spatial dims
    sliced_cl = base.contiguous(memory_format=torch.channels_last)[:, 1:4]
    assert kernel_memory_format(sliced_cl) == torch.channels_last  # a channels_last slice stays channels_last
    assert ours(sliced_cl).is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [
    # y and dx are rounded once to the input dtype from fp32 maths: 2 ulps relative (+ a small atol).
    (torch.bfloat16, dict(atol=1e-3, rtol=2.0**-7)), (torch.float16, dict(atol=2e-4, rtol=2.0**-9)),
])
def test_low_precision_input_with_fp32_parameters(dtype: torch.dtype, tol: dict, device: str) -> None:
    ours = SyncBatchNorm2d(4, device=device)  # fp32 parameters and buffers, as under autocast
    ref = nn.BatchNorm2d(4, device=device, dtype=torch.float64)
    x = torch.randn(3, 4, 5, 5, device=device).to(dtype)
    g = torch.randn(3, 4, 5, 5, device=device).to(dtype)
    xa, xr = x.clone().requires_grad_(), x.double().requires_grad_()
    ya, yr = ours(xa), ref(xr)
    ya.backward(g)
    yr.backward(g.double())
    assert ya.dtype == dtype and xa.grad.dtype == dtype and ours.weight.grad.dtype == torch.float32
    torch.testing.assert_close(ya.double(), yr, **tol)
    torch.testing.assert_close(xa.grad.double(), xr.grad, **tol)
    # parameter grads and statistics are fp32 sums over 75 values per channel
    torch.testing.assert_close(ours.weight.grad.double(), ref.weight.grad, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(ours.running_var.double(), ref.running_var, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_like_batchnorm_and_no_collectives(device: str) -> None:
    ours, ref = _pair(nn.BatchNorm2d, (3,), {"momentum": None}, device)
    with torch.no_grad():
        ours.running_mean.fill_(2.0)
        ours.running_var.fill_(3.0)
    ref.load_state_dict(ours.state_dict())
    before = dict(collectives.call_counts)
    _assert_same_step(ours, ref, torch.randn(0, 3, 4, 4, device=device), F32_TOL)
    assert ours.num_batches_tracked.item() == 1 and ours.running_mean.eq(2.0).all()
    assert torch.equal(ours.weight.grad, torch.zeros_like(ours.weight))
    _assert_same_step(ours, ref, torch.randn(4, 3, 4, 4, device=device), F32_TOL)
    assert collectives.call_counts == before  # no process group: never communicates


@pytest.mark.parametrize("device", DEVICES)
def test_eval_without_running_stats_uses_batch_stats(device: str) -> None:
    ours, ref = _pair(nn.BatchNorm2d, (3,), {"track_running_stats": False}, device)
    ours.eval()
    ref.eval()
    _assert_same_step(ours, ref, torch.randn(2, 3, 4, 4, device=device), F32_TOL)


def test_under_cpu_autocast_like_batchnorm() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3)
    ours, ref = nn.Sequential(conv, SyncBatchNorm2d(4)), nn.Sequential(conv, nn.BatchNorm2d(4))
    x = torch.randn(2, 3, 6, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ya, yb = ours(x), ref(x)
    assert ya.dtype == yb.dtype == torch.bfloat16
    # same bf16 conv output in both; BN maths in fp32, result rounded to bf16 (2 ulps, see above)
    torch.testing.assert_close(ya, yb, atol=1e-3, rtol=2.0**-7)
    torch.testing.assert_close(ours[1].running_var, ref[1].running_var, atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
def test_training_step_never_syncs_with_the_host_on_cuda() -> None:
    """After the first step (which loads the extension and, the first time this process uses the GPU, runs the
    layer's self-check: both may synchronise), training steps never wait for the device. Alone or after other
    tests: the warm-up step does whatever first use needs here."""
    layer = SyncBatchNorm2d(8, momentum=None, device="cuda")  # cumulative average: read on the device
    x = torch.randn(4, 8, 5, 5, device="cuda").contiguous(memory_format=torch.channels_last).requires_grad_()
    g = torch.randn(4, 8, 5, 5, device="cuda")
    layer(x).backward(g)  # the warm-up: extension, first-use self-check, allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host<->device synchronisation raises
    try:
        for _ in range(2):
            layer(x).backward(g)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert layer.num_batches_tracked.item() == 3


def test_the_layer_keeps_no_tensor_state_beyond_batchnorms() -> None:
    """Nothing the exchange uses is kept between steps: no tensor outside nn.BatchNorm2d's parameters and buffers, so
    nothing ranks could come to disagree on (a cast, move or reset on one rank only changes only what it changes
    in nn.BatchNorm too)."""
    layer, reference = SyncBatchNorm2d(3), torch.nn.BatchNorm2d(3)
    layer(torch.randn(4, 3, 2, 2))
    assert layer.state_dict().keys() == reference.state_dict().keys()
    held = {name for name, value in vars(layer).items() if isinstance(value, torch.Tensor)}
    assert held == {name for name, value in vars(reference).items() if isinstance(value, torch.Tensor)} == set()


def test_an_unknown_exchange_is_refused() -> None:
    layer = SyncBatchNorm2d(3)
    layer.exchange = "broadcast"
    with pytest.raises(ValueError, match=r"exchange='broadcast': expected one of \('all_reduce', 'all_gather'\)"):
        layer(torch.randn(4, 3, 2, 2))
