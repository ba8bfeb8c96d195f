"""Detection: boxes and classes per image (torchvision's detectors). The task (task.py) registers itself; its
transforms are transforms.py here."""
from src.tasks.detection.task import DETECTION, Detection

__all__ = ["DETECTION", "Detection"]
