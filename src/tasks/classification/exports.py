"""evaluate.py's export=DIR for classification, written from rank 0 in dataset order (docs/evaluation.md):
`predictions.npy` (int64 [N], entry i = predicted class of dataset sample i) and `predictions.csv` (header
`index,prediction`, one row per sample in dataset order)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def export_classification(out_dir: Path, indices: torch.Tensor, preds: torch.Tensor) -> None:
    """Write predictions.npy and predictions.csv (call on rank 0 with the gathered, index-sorted rows)."""
    order = indices.argsort(stable=True)
    indices, preds = indices[order].numpy(), preds[order].numpy().astype(np.int64)
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / "predictions.npy", preds)
    with open(out_dir / "predictions.csv", "w", encoding="utf-8") as f:
        f.write("index,prediction\n")
        f.writelines(f"{i},{p}\n" for i, p in zip(indices.tolist(), preds.tolist()))
