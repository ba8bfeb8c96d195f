"""Multi-label classification's data handling: classification's transforms (the whole image, cropped, flipped,
augmented; evaluation and predict.py's input alike), with the multi-hot target passing through them untouched.

torchvision.transforms.v2 transforms a plain tensor only when the sample holds no image (tv_tensors.Image or PIL):
the datasets give their image as one of those, so the float [K] target is never mistaken for an image. The targets
stack into float [N, K] (collate_stacked).
"""
from __future__ import annotations

from src.data.task_data import TaskData
from src.tasks.classification.transforms import (classification_eval_transform, classification_predict_transform,
                                                 classification_train_transform)

MULTILABEL_DATA = TaskData("multilabel", train=classification_train_transform, eval=classification_eval_transform,
                           predict=classification_predict_transform, fixed_size=True)
