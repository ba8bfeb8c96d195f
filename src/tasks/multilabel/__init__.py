"""Multi-label classification: any number of labels per image (BCE on per-class logits, mean average precision).
The task (task.py) registers itself; its pieces are its own files here: metrics, options, predictions and
evaluate.py's export, transforms (classification's, with multi-hot targets)."""
from src.tasks.multilabel.task import MULTILABEL, MultiLabel, multilabel_loss

__all__ = ["MULTILABEL", "MultiLabel", "multilabel_loss"]
