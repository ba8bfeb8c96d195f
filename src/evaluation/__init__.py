"""Exact distributed evaluation: the protocol a task implements (protocol.py), the loop that drives it (loop.py),
the helpers the tasks' evaluators share (exact.py) and COCO's evaluation (coco.py, detection's and instance
segmentation's).

It sits below src/tasks: the tasks import its protocol and helpers, and the loop takes the run's Task object from
its callers (src/commands), never a task's name. Importing it needs no pycocotools (coco.py is imported by name).
"""
from __future__ import annotations

from src.evaluation.loop import evaluate
from src.evaluation.protocol import EvalContext, EvaluatedTask, Evaluator

__all__ = ["EvalContext", "EvaluatedTask", "Evaluator", "evaluate"]
