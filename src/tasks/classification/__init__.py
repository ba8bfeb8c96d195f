"""Classification: one label per image. The task (task.py) registers itself; its pieces are its own files here:
metrics, pictures, evaluate.py's export, predict.py's table, transforms."""
from src.tasks.classification.task import CLASSIFICATION, Classification, classification_loss

__all__ = ["CLASSIFICATION", "Classification", "classification_loss"]
