"""Instance segmentation's transforms and TaskData: detection's joint transforms (src/tasks/detection/transforms.py),
which move a target's tv_tensors.Mask "masks" with the image and its boxes, and drop the masks of the boxes that
SanitizeBoundingBoxes drops. Output: image float32 [3, H, W] in [0, 1], target {"boxes": float32 [K, 4] XYXY,
"labels": int64 [K], "masks": uint8 [K, H, W]}; no normalisation and no resizing (Mask R-CNN does both inside)."""
from __future__ import annotations

from src.data.batch import collate_lists
from src.data.task_data import TaskData
from src.tasks.detection.transforms import (detection_eval_transform, detection_predict_transform,
                                            detection_train_transform)

INSTANCE_SEGMENTATION_DATA = TaskData(
    "instance_segmentation", train=detection_train_transform, eval=detection_eval_transform,
    predict=detection_predict_transform, device_transforms=False, collate=collate_lists,
    target_keys=frozenset({"masks"}))  # data=coco reads each annotation's mask only when asked
