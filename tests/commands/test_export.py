"""export.py: a SyncBN checkpoint, written by the real checkpoint writer, exported in each format; the file's
outputs on real images (the embedded shapes sets) equal PyTorch's at two batch sizes and, where the model
allows, another image size, for a classifier (a task's own models: tests/tasks/<task>/test_export.py, which
reuses these tests with its MODELS).

Tolerances (measured on a 2-core AMD EPYC VM, float32, one thread, logits scaled to |logit| ~2-7):
- ExportedProgram and TorchScript run PyTorch's own kernels: max |difference| measured 0 (bit-identical) for
  both models at every shape; bound 1e-5 absolute, room for another CPU's kernel choice.
- onnxruntime has its own convolution kernels and folds BatchNorm into the convolutions: measured max
  |difference| 1.4e-6 (classifier) and 1.3e-6 (segmenter); bound 1e-4 absolute + 1e-5 relative (~70x).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from src.commands.export import FORMATS, SUFFIXES, inference_module, load_trained_model, run
from src.config import config_dict, validate_config
from tests.support.task_data import build_datasets
from src.engine.checkpoint.files import atomic_write_bytes, serialize
from src.engine.checkpoint.state import TrainState
from src.engine.optim import build_optimizer, build_scheduler
from src.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")  # reference forwards on one thread (conftest.py)
REPO = Path(__file__).resolve().parents[2]
EXACT_ATOL = 1e-5  # ExportedProgram / TorchScript: PyTorch's kernels (measured 0)
ORT_ATOL, ORT_RTOL = 1e-4, 1e-5  # onnxruntime's kernels (measured <= 1.4e-6)
Checkpoint = tuple[str, Path, dict, list[str]]  # kind, file, weights, overrides

MODELS = {
    # A CIFAR ResNet-20 on shapes (32x32): classifier with global pooling, any image size.
    "classifier": ["model=resnet20", "norm=syncbn", "data=shapes", "data.num_classes=4"],
}


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return validate_config(compose("train", overrides=overrides + ["data.train_size=8", "data.val_size=8"]))


def _write_checkpoint(path: Path, overrides: list[str]) -> dict[str, torch.Tensor]:
    """Build the model with norm=syncbn, give every tensor (running statistics too) random values, and write a
    checkpoint through TrainState.state_dict + the checkpoint writer (serialize, atomic_write_bytes), as training does.
    Returns the weights."""
    cfg = _compose(overrides)
    names = build_datasets(cfg.data, seed=0).class_names
    with torch.random.fork_rng(devices=[]):  # seeded initial weights; the caller's generator left as it was
        torch.manual_seed(0)
        model = build_model(cfg.model, cfg.norm, len(names))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for key, t in model.state_dict().items():
            if "running_var" in key:
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif "running_mean" in key:
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
            elif t.is_floating_point() and key.endswith(".weight") and t.dim() == 1:  # norm scales
                t.copy_(1 + 0.2 * torch.randn(t.shape, generator=g))
        # Logits of magnitude ~10, like a trained model's, so the absolute tolerances below mean something.
        head = [m for n, m in model.named_modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))
                and not n.startswith("aux") and getattr(m, "out_channels", getattr(m, "out_features", 0)) == len(names)]
        head[-1].weight.mul_(10.0 / model_logit_scale(model, cfg))
    optimizer = build_optimizer(model, cfg.optim, cfg.data.batch_size)
    scheduler = build_scheduler(optimizer, cfg.sched, 1, cfg.trainer.epochs)
    state = TrainState(model, optimizer, scheduler, torch.amp.GradScaler("cpu", enabled=False),
                       config=config_dict(cfg), class_names=list(names))
    atomic_write_bytes(serialize(state.state_dict()), path)
    return {k: v.clone() for k, v in model.state_dict().items()}


def model_logit_scale(model: torch.nn.Module, cfg) -> float:
    """The largest |logit| of the model (eval mode) on a random batch."""
    side = cfg.data.image_size
    with torch.no_grad():
        out = inference_module(model, cfg.resolved_task.export_output)(
            torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(2)))
    model.train()
    return float(out.abs().max())


def written_checkpoint(kind: str, overrides: list[str], factory: pytest.TempPathFactory) -> Checkpoint:
    """A `checkpoint` fixture's value: (kind, its file, its weights, the overrides it was trained with)."""
    path = factory.mktemp(kind) / "last.pt"
    return kind, path, _write_checkpoint(path, overrides), overrides


@pytest.fixture(scope="module", params=sorted(MODELS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return written_checkpoint(request.param, MODELS[request.param], tmp_path_factory)


@pytest.fixture(scope="module")
def reference(checkpoint: Checkpoint) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """The checkpoint's model as PyTorch runs it, and the real image batches to compare on."""
    kind, ckpt, _, _ = checkpoint
    trained = load_trained_model(ckpt)
    val = build_datasets(trained.config.data, seed=0).val
    images = torch.stack([val[i][0] for i in range(5)])
    side = images.shape[-1]
    other = torch.nn.functional.interpolate(images[:3], size=(side + 8, side + 16), mode="bilinear",
                                            align_corners=False)
    # Two batch sizes, neither the example's 2, and another, non-square image size.
    return inference_module(trained.model, trained.task.export_output), [images[:1], images, other]


def _export(ckpt: Path, fmt: str, out: Path) -> Path:
    return run(OmegaConf.create({"ckpt": str(ckpt), "format": fmt, "out": str(out), "ema": False, "batch_size": 2,
                                 "image_size": None}))


def _runner(fmt: str, path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    if fmt == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])
    if fmt == "exported_program":
        program = torch.export.load(str(path))
        return lambda x: program.module()(x)
    scripted = torch.jit.load(str(path))
    return lambda x: scripted(x)


@pytest.mark.parametrize("fmt", FORMATS)
def test_exported_file_computes_the_checkpoint_model(checkpoint: Checkpoint, reference: tuple, fmt: str,
                                                     tmp_path: Path) -> None:
    kind, ckpt, _, _ = checkpoint
    model, cases = reference
    out = _export(ckpt, fmt, tmp_path / f"model{SUFFIXES[fmt]}")
    exported = _runner(fmt, out)
    atol, rtol = (ORT_ATOL, ORT_RTOL) if fmt == "onnx" else (EXACT_ATOL, 0.0)
    for images in cases:
        with torch.no_grad():
            expected = model(images)
            got = exported(images)
        assert got.shape == expected.shape
        diff = (got - expected).abs().max().item()
        print(f"{kind} {fmt} {tuple(images.shape)}: max |diff| {diff:.3g}, max |logit| {expected.abs().max():.3g}")
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


def test_syncbn_is_reverted_and_running_statistics_kept(checkpoint: Checkpoint) -> None:
    """Also when the model arrives with SyncBatchNorm layers (as a trained model in memory does)."""
    kind, ckpt, weights, overrides = checkpoint
    from src.syncbn import SyncBatchNorm

    cfg = _compose(overrides)
    model = build_model(cfg.model, cfg.norm, len(load_trained_model(ckpt).class_names))
    assert any(isinstance(m, SyncBatchNorm) for m in model.modules())
    model.load_state_dict(weights)
    exported = inference_module(model, cfg.resolved_task.export_output)
    assert not any(isinstance(m, (SyncBatchNorm, torch.nn.SyncBatchNorm)) for m in exported.modules())
    assert not exported.training
    state = exported.model.state_dict()
    for key, value in weights.items():
        assert torch.equal(state[key], value), key


def test_bad_arguments_are_refused_naming_the_key(tmp_path: Path, checkpoint: Checkpoint) -> None:
    _, ckpt, _, _ = checkpoint
    base = {"ckpt": str(ckpt), "format": "onnx", "out": str(tmp_path / "m.onnx"), "ema": False, "batch_size": 2,
            "image_size": None}
    cases = [({"format": "tflite"}, ValueError, "format=tflite is not an export format; use one of onnx"),
             ({"format": None}, ValueError, "format is required"),
             ({"ckpt": str(tmp_path / "nope.pt")}, FileNotFoundError, "no such file"),
             ({"out": str(tmp_path)}, ValueError, "is a folder"),
             ({"format": "exported_program", "out": str(tmp_path / "m.pt")}, ValueError, r"end in \.pt2"),
             ({"batch_size": 1}, ValueError, "batch_size=1"),
             ({"ema": True}, ValueError, "holds no EMA weights")]
    for change, error, match in cases:
        with pytest.raises(error, match=match):
            run(OmegaConf.create({**base, **change}))
    assert not (tmp_path / "m.onnx").exists()


def test_command_line(tmp_path: Path) -> None:
    """The entry point as a process (torchscript: the quickest format; the others share the code path)."""
    ckpt = tmp_path / "last.pt"
    _write_checkpoint(ckpt, MODELS["classifier"])
    out = tmp_path / "exported" / "model.pt"
    command = [sys.executable, str(REPO / "export.py"), f"ckpt={ckpt}", f"out={out}"]
    proc = subprocess.run(command + ["format=torchscript"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.is_file() and f"as torchscript: {out}" in proc.stdout
    bad = subprocess.run(command + ["format=tf"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "format=tf is not an export format" in bad.stderr
