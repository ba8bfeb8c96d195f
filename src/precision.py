"""Dtype rules shared by the loop, the tasks and the commands: trainer.dtype (the dtype of weights, inputs, losses and
optimizer state), trainer.amp's autocast and GradScaler, losses and metrics never computed below float32, and inputs
in the model's parameter dtype."""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
from torch import nn

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # trainer.amp
PRECISIONS = {"float32": torch.float32, "float64": torch.float64}  # trainer.dtype


def autocast(mode: str, device: torch.device) -> ContextManager:
    """torch.autocast for bf16/fp16 on `device`; a no-op for "none"."""
    if mode == "none":
        return contextlib.nullcontext()
    if mode not in DTYPES:
        raise ValueError(f"amp must be one of none|{'|'.join(DTYPES)}, got {mode!r}")
    return torch.autocast(device_type=device.type, dtype=DTYPES[mode])


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in float32 when it is in a lower precision (AMP outputs); float64 stays float64."""
    return tensor if tensor.dtype == torch.float64 else tensor.float()


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's floating-point parameters (inputs are cast to it); float32 without any."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def build_scaler(mode: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16 (bf16 has fp32's range and needs no loss scaling)."""
    return torch.amp.GradScaler(device.type, enabled=mode == "fp16")
