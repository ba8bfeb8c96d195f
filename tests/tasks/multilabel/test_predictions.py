"""predict.py's multi-label table: the labels whose probability reaches the threshold, most probable first, and every
class's probability, one row per input in input order, whatever order the batches came in."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from src.data.batch import Batch
from src.tasks.multilabel import MULTILABEL
from src.tasks.multilabel.options import MultiLabelPredict


@pytest.mark.parametrize("threshold, labels", [(0.5, ["c b", "a c"]), (0.7, ["c", "a"]), (0.2, ["c b", "a c b"])])
def test_the_labels_reach_the_threshold_and_every_probability_is_listed(tmp_path: Path, threshold: float,
                                                                        labels: list[str]) -> None:
    logits = torch.tensor([[2.0, -1.0, 0.0], [-3.0, 0.5, 1.0]])  # sigmoid: .881 .269 .5; .047 .622 .731
    batches = [Batch(torch.zeros(2, 3, 4, 4), None, torch.tensor([1, 0]))]  # the rows of inputs 1 and 0
    path = MULTILABEL.predict(batches, lambda batch: logits, files=[Path("x.jpg"), Path("y/z.jpg")], out_dir=tmp_path,
                              class_names=["a", "b", "c"], batch_count=1, options=MultiLabelPredict(threshold))
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [["file", "labels", "prob_a", "prob_b", "prob_c"],
                    ["x.jpg", labels[0], "0.047426", "0.622459", "0.731059"],
                    ["y/z.jpg", labels[1], "0.880797", "0.268941", "0.500000"]]


@pytest.mark.parametrize("value", [0.0, 1.0, True, "high"])
def test_threshold_is_a_probability(value: object) -> None:
    with pytest.raises(ValueError, match="threshold is a probability in \\(0, 1\\)"):
        MultiLabelPredict(value).validate()
