"""Training precision: trainer.dtype (the dtype of weights, inputs, losses and optimizer state) and trainer.amp's
GradScaler. Autocast and the float32 floor of losses and metrics are src/precision.py's (the tasks use them too)."""
from __future__ import annotations

import torch

PRECISIONS = {"float32": torch.float32, "float64": torch.float64}  # trainer.dtype


def build_scaler(mode: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16 (bf16 has fp32's range and needs no loss scaling)."""
    return torch.amp.GradScaler(device.type, enabled=mode == "fp16")
