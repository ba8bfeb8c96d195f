"""What the tasks' evaluators share: metric names made from class names."""
from __future__ import annotations

from src.evaluation.exact import metric_name


def test_metric_name() -> None:
    assert metric_name("traffic light") == "traffic_light" and metric_name("t-shirt/top") == "t-shirt_top"
