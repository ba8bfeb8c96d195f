"""Instance segmentation: per object a mask, a box and a class (torchvision's Mask R-CNN). The task (task.py)
registers itself; its transforms are transforms.py here, its COCO masks masks.py, predict.py's files
predictions.py."""
from src.tasks.instance_segmentation.task import INSTANCE_SEGMENTATION, InstanceSegmentation

__all__ = ["INSTANCE_SEGMENTATION", "InstanceSegmentation"]
