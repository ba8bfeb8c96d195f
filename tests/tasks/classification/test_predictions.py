"""predict.py's classification table: its rows and CSV quoting."""
from __future__ import annotations

import csv
from pathlib import Path

from src.tasks.classification.predictions import write_predictions_csv


def test_csv_rows_and_quoting(tmp_path: Path) -> None:
    path = tmp_path / "out" / "predictions.csv"
    write_predictions_csv(path, ["a.jpg", "dir/b,c.jpg"], [["cat", "dog, large"], ["dog, large", "cat"]],
                          [[0.75, 0.25], [0.5, 0.4999996]])
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [["file", "class_1", "prob_1", "class_2", "prob_2"],
                    ["a.jpg", "cat", "0.750000", "dog, large", "0.250000"],
                    ["dir/b,c.jpg", "dog, large", "0.500000", "cat", "0.500000"]]
