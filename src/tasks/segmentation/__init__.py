"""Segmentation: a class per pixel. The task (task.py) registers itself; its pieces are its own files here:
metrics, pictures, evaluate.py's export, predict.py's masks, transforms (its data-layer part:
src/data/segmentation/)."""
from src.tasks.segmentation.task import SEGMENTATION, Segmentation, segmentation_loss

__all__ = ["SEGMENTATION", "Segmentation", "segmentation_loss"]
