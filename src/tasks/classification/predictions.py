"""predict.py's classification output: out/predictions.csv, one row per input: file, then class_1, prob_1 ...
class_k, prob_k (the k most probable classes, most probable first)."""
from __future__ import annotations

import csv
from pathlib import Path

PREDICTIONS_CSV = "predictions.csv"


def write_predictions_csv(path: Path, files: list[str], classes: list[list[str]], probs: list[list[float]]) -> None:
    """The classification table: one row per file, k (class, probability) pairs per row."""
    k = len(classes[0]) if classes else 0
    header = ["file"] + [f"{name}_{i}" for i in range(1, k + 1) for name in ("class", "prob")]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)  # quotes class names or file names that contain commas
        writer.writerow(header)
        for file, names, ps in zip(files, classes, probs):
            writer.writerow([file] + [v for name, p in zip(names, ps) for v in (name, f"{p:.6f}")])
