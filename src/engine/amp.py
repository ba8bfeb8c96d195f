"""Mixed precision: autocast context and GradScaler for trainer.amp = none | bf16 | fp16."""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(mode: str, device: torch.device) -> ContextManager:
    """torch.autocast for bf16/fp16 on `device`; a no-op for "none"."""
    if mode == "none":
        return contextlib.nullcontext()
    if mode not in DTYPES:
        raise ValueError(f"amp must be one of none|{'|'.join(DTYPES)}, got {mode!r}")
    return torch.autocast(device_type=device.type, dtype=DTYPES[mode])


def build_scaler(mode: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16 (bf16 has fp32's range and needs no loss scaling)."""
    return torch.amp.GradScaler(device.type, enabled=mode == "fp16")
