"""trainer.compile: torch.compile around the forward module, the module evaluation runs, and clear failures.

- Training compiles the module the forward goes through, i.e. *after* DDP wrapping, as PyTorch's DDP
  notes recommend: Dynamo's DDPOptimizer then splits the captured graph at DDP's gradient-bucket
  boundaries, so the gradient all-reduces still overlap the backward. DDP's own forward is not traced
  (its Python logger and the deliberately skipped `_inside_ddp_forward` are graph breaks *in DDP*); the
  model's forward is traced on its own, as one graph when it has no graph break (CompileReport logs it).
- Evaluation runs the same compiled model in eval mode: `torch.compile(model)` around the bare model
  (not through DDP, whose forward may communicate while ranks evaluate different numbers of batches).
  Without DDP it is literally the training module. Eval mode and inference mode are guarded on, so the
  first evaluation compiles the eval graph once; EMA weights are evaluated eagerly.
- A model or option that cannot be compiled raises CompileError at its first compiled step, naming the
  model, the settings that shape the graph and PyTorch's one-paragraph reason, instead of Dynamo's
  traceback page (TORCHDYNAMO_VERBOSE=1 still gives that).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from src.config import TrainConfig, TrainerConfig
from src.engine.hooks import Hook, TrainerView

log = logging.getLogger(__name__)


class CompileError(RuntimeError):
    """torch.compile could not compile the configured model (trainer.compile=true)."""


def compile_modules(module: nn.Module, model: nn.Module, settings: TrainerConfig) -> tuple[nn.Module, nn.Module]:
    """(training forward module, evaluation module), compiled when trainer.compile is set, else (module, model).

    `module` is what the forward goes through (DDP around `model` when distributed, else `model`).
    """
    if not settings.compile:
        return module, model
    mode = None if settings.compile_mode == "default" else settings.compile_mode
    train = torch.compile(module, mode=mode)
    return train, (train if module is model else torch.compile(model, mode=mode))


def compile_failure(err: BaseException, cfg: TrainConfig) -> Optional[CompileError]:
    """A CompileError explaining `err` when it is a torch.compile failure (Dynamo or its backend), else None."""
    dynamo_exc = getattr(getattr(torch, "_dynamo", None), "exc", None)
    if dynamo_exc is None or not isinstance(err, dynamo_exc.TorchDynamoException):
        return None
    t = cfg.trainer
    shape = (f"model.name={cfg.model.name}"
             + (f" model.arch={cfg.model.arch}" if getattr(cfg.model, "arch", None) else "")
             + f", norm={cfg.norm.name}, trainer.compile_mode={t.compile_mode}, trainer.dtype={t.dtype}, "
             f"trainer.amp={t.amp}, trainer.channels_last={str(t.channels_last).lower()}")
    return CompileError(
        f"trainer.compile=true: torch.compile could not compile {shape}:\n{_reason(err)}\n"
        "Train this model without compiling (trainer.compile=false), or change the setting named above; "
        "TORCHDYNAMO_VERBOSE=1 prints PyTorch's full report."
    )


def _reason(err: BaseException, max_lines: int = 12) -> str:
    """The head of PyTorch's message (what failed, why) and the user-code line it points at, not the hints."""
    lines = [line.rstrip() for line in str(err).splitlines()]
    head: list[str] = []
    for line in lines:
        if not line.strip() or line.strip().startswith(("Hint:", "Developer debug context", "For more details")):
            if head:
                break
            continue
        head.append(line)
    where: list[str] = []
    if "from user code:" in lines:  # Dynamo's stack of user frames, innermost last: keep that one
        frames = []
        for line in lines[lines.index("from user code:") + 1:]:
            if not line.strip():
                break
            frames.append(line.strip())
        files = [i for i, line in enumerate(frames) if line.startswith("File ")]
        if files:
            where = ["at " + frames[files[-1]]] + [f"    {code}" for code in frames[files[-1] + 1:files[-1] + 2]
                                                     if not set(code) <= set("^~ ")]
    return "\n".join(f"  {line}" for line in (head[:max_lines] + where))


class CompileReport(Hook):
    """After the first optimizer step: how long compiling took and into how many graphs the forward went."""

    def after_step(self, trainer: TrainerView) -> None:
        if trainer.state.progress.step != 1 or trainer.last_step is None:
            return
        from torch._dynamo.utils import counters

        graphs = counters["stats"]["unique_graphs"]
        log.info("torch.compile: first step (compiling forward and backward) took %.1f s; the training forward "
                 "is %d graph(s) (1 = the whole model, no graph break in it)", trainer.last_step.seconds, graphs)
