"""`export.py ckpt=PATH format=onnx|exported_program|torchscript out=FILE`: a checkpoint's model as one file.

The model is the checkpoint's, read by load_trained_run (src/commands/trained_run.py, the reader of
predict.py and evaluate.py too: SyncBN models come back as BatchNorm, on the CPU here), with
every SyncBatchNorm reverted to BatchNorm (running statistics kept) and in eval mode, so the file computes
exactly what evaluation and prediction compute and needs neither our kernels nor a process group. Its one
input is a normalised float image batch [N, 3, H, W] (the training data's normalisation: mean / std in the
checkpoint's data config); its one output the logits, [N, classes] for classifiers and [N, classes, H, W]
for segmenters (the "out" entry: the auxiliary head is a training device and is left out).

Dynamic shapes: the batch size always; height and width wherever the model allows (torch.export's Dim.AUTO
keeps them symbolic unless the model fixes them, as a ViT's position embedding does). The three formats:
- exported_program: torch.export.export, saved with torch.export.save (load with torch.export.load);
- onnx: the same ExportedProgram through torch.onnx.export (the dynamo exporter), checked with onnx.checker;
- torchscript: torch.jit.trace (load with torch.jit.load): tracing keeps shapes symbolic where they are read
  from tensors, as in F.interpolate(size=x.shape[-2:]).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from omegaconf import DictConfig
from torch import nn

from src.errors import UserError

if TYPE_CHECKING:
    from src.commands.trained_run import TrainedRun

USAGE = "python export.py ckpt=<run dir>/checkpoints/last.pt format=onnx|exported_program|torchscript out=<file>"
FORMATS = ("onnx", "exported_program", "torchscript")
SUFFIXES = {"onnx": ".onnx", "exported_program": ".pt2", "torchscript": ".pt"}
# torch.export specialises a dimension whose example size is 0 or 1; the example batch must be larger.
MIN_EXAMPLE_BATCH = 2


class LogitsOnly(nn.Module):
    """The model with one tensor output, the one its task exports (a segmenter's {"out", "aux"}: its "out")."""

    def __init__(self, model: nn.Module, output: Callable[[Any], torch.Tensor],
                 forward: Callable[[nn.Module, torch.Tensor], Any] = lambda model, images: model(images)) -> None:
        super().__init__()
        self.model = model
        self.output = output  # Task.export_output
        self.eval_forward = forward  # Task.eval_forward

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits of a normalised image batch."""
        return self.output(self.eval_forward(self.model, images))


def run(cfg: DictConfig) -> Path:
    """Export cfg.ckpt's model to cfg.out in cfg.format; returns the written file."""
    ckpt, fmt, out = check_arguments(cfg)
    trained = load_trained_model(ckpt, ema=bool(cfg.ema))
    model = inference_module(trained.model, trained.task.export_output, trained.task.eval_forward)
    size = int(cfg.image_size) if cfg.get("image_size") else trained.task.export_size(trained.config.data)
    batch = int(cfg.batch_size)
    dtype = next(model.parameters()).dtype
    example = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0), dtype=dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    EXPORTERS[fmt](model, example, out)
    print(f"exported {trained.path} ({trained.task.name}, {len(trained.class_names)} classes) as {fmt}: {out}; "
          f"input: float [N, 3, H, W] normalised with mean={list(trained.config.data.mean)} "
          f"std={list(trained.config.data.std)}", flush=True)
    return out


def load_trained_model(ckpt: Path, ema: bool = False) -> TrainedRun:
    """The checkpoint's TrainedRun on the CPU in the contiguous memory format: the one place export reads a
    checkpoint (load_trained_run, shared with predict.py and evaluate.py)."""
    from src.commands.trained_run import load_trained_run

    trained = load_trained_run(ckpt, ema=ema, device=torch.device("cpu"))
    trained.model.to(memory_format=torch.contiguous_format)  # a channels_last run's model comes back NHWC
    return trained


def check_arguments(cfg: DictConfig) -> tuple[Path, str, Path]:
    """ckpt, format and out, checked before anything is read: each error names the key and the fix."""
    missing = [k for k in ("ckpt", "format", "out") if not cfg.get(k)]
    if missing:
        raise UserError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required: {USAGE}")
    fmt = str(cfg.format)
    if fmt not in FORMATS:
        raise UserError(f"format={fmt} is not an export format; use one of {', '.join(FORMATS)}")
    from src.engine.checkpoint.files import checkpoint_file

    ckpt = checkpoint_file(cfg.ckpt, "ckpt")
    out = Path(str(cfg.out)).expanduser()
    if out.is_dir():
        raise UserError(f"out={cfg.out} is a folder; give the file to write, e.g. out={out / ('model' + SUFFIXES[fmt])}")
    if fmt == "exported_program" and out.suffix != SUFFIXES[fmt]:
        # torch.export.save / load only accept files ending in .pt2 (the PT2 archive format).
        raise UserError(f"out={cfg.out}: format=exported_program writes a PT2 archive, whose name must end in "
                        f".pt2, e.g. out={out.with_suffix('.pt2')}")
    if int(cfg.batch_size) < MIN_EXAMPLE_BATCH:
        raise UserError(f"batch_size={cfg.batch_size}: the example batch must be >= {MIN_EXAMPLE_BATCH} (the "
                        "exported batch size is dynamic either way; an example of 1 would fix it to 1)")
    if cfg.get("image_size") is not None and int(cfg.image_size) < 8:
        raise UserError(f"image_size={cfg.image_size} must be >= 8 (or null: the training data's size)")
    return ckpt, fmt, out


def inference_module(model: nn.Module, output: Callable[[Any], torch.Tensor] = lambda out: out,
                     forward: Callable[[nn.Module, torch.Tensor], Any] = lambda model, images: model(images)
                     ) -> nn.Module:
    """The model with SyncBatchNorm layers reverted to BatchNorm (the same tensors: `model` itself is changed),
    run by `forward` (the task's eval_forward) and wrapped to the one output `output` picks (the task's
    export_output), in eval mode."""
    from src.syncbn import revert_sync_batchnorm

    model = revert_sync_batchnorm(model)
    left = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.SyncBatchNorm)
                   or type(m).__module__.startswith("src.syncbn")})
    if left:
        raise RuntimeError(f"{left} left in the model after revert_sync_batchnorm: cannot export it")
    return LogitsOnly(model, output, forward).eval()


def dynamic_shapes() -> dict[str, dict[int, Any]]:
    """Batch always dynamic (an error if the model fixed it); height and width where the model allows."""
    from torch.export import Dim

    return {"images": {0: Dim.DYNAMIC, 2: Dim.AUTO, 3: Dim.AUTO}}


def export_program(model: nn.Module, example: torch.Tensor) -> torch.export.ExportedProgram:
    """torch.export of the eval-mode model with the dynamic shapes above."""
    with torch.no_grad():
        return torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes())


def _exported_program(model: nn.Module, example: torch.Tensor, out: Path) -> None:
    torch.export.save(export_program(model, example), str(out))


def _onnx(model: nn.Module, example: torch.Tensor, out: Path) -> None:
    try:
        import onnx
    except ImportError as err:
        raise ImportError(f"format=onnx needs the onnx and onnxscript packages ({err}); pip install -r "
                          "requirements.txt") from err
    program = export_program(model, example)
    onnx_program = torch.onnx.export(program, (example,), input_names=["images"], output_names=["logits"],
                                     dynamo=True, external_data=False)
    onnx_program.save(str(out))
    onnx.checker.check_model(str(out), full_check=True)


def _torchscript(model: nn.Module, example: torch.Tensor, out: Path) -> None:
    with torch.no_grad():
        traced = torch.jit.trace(model, (example,), check_trace=False)
    torch.jit.save(traced, str(out))


EXPORTERS = {"onnx": _onnx, "exported_program": _exported_program, "torchscript": _torchscript}
