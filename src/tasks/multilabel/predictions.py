"""Multi-label classification's tables: predict.py's out/predictions.csv and evaluate.py's export.

One row per image: its name (predict.py: the input's relative path; evaluate.py: the dataset index), `labels` (the
classes whose probability is at least the threshold, separated by spaces, most probable first) and one
`prob_<class>` column per class (the sigmoid of its logit, 6 decimals).
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

PREDICTIONS_CSV = "predictions.csv"
PROBABILITIES_NPY = "probabilities.npy"  # evaluate.py export=DIR: float32 [N, K] in dataset order


def labels_above(probs: np.ndarray, class_names: list[str], threshold: float) -> str:
    """The classes whose probability in `probs` [K] is at least `threshold`, most probable first, space-separated."""
    order = np.argsort(-probs, kind="stable")
    return " ".join(class_names[k] for k in order if probs[k] >= threshold)


def write_predictions_csv(path: Path, key: str, names: list[str], probs: np.ndarray, class_names: list[str],
                          threshold: float) -> None:
    """The table: a `key` column (file or index) of `names`, `labels`, then prob_<class> for every class."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)  # quotes names that contain commas
        writer.writerow([key, "labels", *(f"prob_{name}" for name in class_names)])
        for name, row in zip(names, probs):
            writer.writerow([name, labels_above(row, class_names, threshold), *(f"{p:.6f}" for p in row)])
