"""Detection's pictures, for predict.py draw=true and TensorBoard (instance segmentation adds its masks): the image
enlarged to be read, one box per object by default, each labelled with its class and score in the class's colour,
and a legend of the classes drawn (the drawing itself: src/tasks/pictures.py).

One box per object: a detector often scores several classes on one object (a square seen as 0.6 square, 0.3
diamond, 0.2 circle), each a box of its own after its per-class non-maximum suppression. For the drawing only, boxes
that overlap a higher-scoring box of any class by more than DRAW_IOU are left out (class-agnostic NMS);
predictions.json keeps every box.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torchvision.ops import nms
from torchvision.utils import make_grid

from src.tasks.pictures import (MIN_LONG_SIDE, TENSORBOARD_LONG_SIDE, add_legend, class_colour, class_name,
                                draw_labelled_boxes, enlarge, enlargement, overlay_masks, unit_to_uint8)

DRAW_IOU = 0.5  # boxes overlapping a higher-scoring one by more than this IoU are not drawn (every_box=false)
TRUTH_COLOUR = (255, 255, 255)  # TensorBoard: the ground-truth boxes, unlabelled, under the predictions


def boxes_to_draw(prediction: dict[str, torch.Tensor], score_threshold: float, every_box: bool) -> torch.Tensor:
    """Indices of the boxes to draw, lowest score first (so the best is drawn last, on top): those scoring at least
    `score_threshold`, and unless `every_box`, only the best of boxes overlapping by more than DRAW_IOU."""
    scores = prediction["scores"].detach().float().cpu().reshape(-1)
    keep = torch.nonzero(scores >= score_threshold).flatten()
    if not every_box and len(keep) > 1:
        keep = keep[nms(prediction["boxes"].detach().float().cpu().reshape(-1, 4)[keep], scores[keep], DRAW_IOU)]
    return keep[torch.argsort(scores[keep], stable=True)]


def detection_picture(pixels: torch.Tensor, prediction: dict[str, torch.Tensor], class_names: Sequence[str] | None,
                      *, score_threshold: float, every_box: bool = False, masks: torch.Tensor | None = None,
                      truth: torch.Tensor | None = None, min_long_side: int = MIN_LONG_SIDE) -> torch.Tensor:
    """uint8 [3, H', W']: the uint8 image `pixels` [3, H, W] enlarged (long side >= min_long_side), with the boxes
    boxes_to_draw chooses (and their boolean `masks` [N, H, W], if given), labelled "<class> <score>", one colour per
    class, `truth` boxes (xyxy) outlined in white underneath, and a legend of the classes drawn on the right."""
    height, width = pixels.shape[-2:]
    factor = enlargement(height, width, min_long_side)
    picture = enlarge(pixels.cpu(), factor)
    chosen = boxes_to_draw(prediction, score_threshold, every_box)
    labels = [int(c) for c in prediction["labels"].detach().cpu().reshape(-1)[chosen]]
    scores = prediction["scores"].detach().float().cpu().reshape(-1)[chosen].tolist()
    colours = [class_colour(c) for c in labels]
    if masks is not None and len(chosen):
        picture = overlay_masks(picture, enlarge(masks.cpu().bool()[chosen], factor), colours)
    if truth is not None and len(truth):
        truth = truth.detach().float().cpu().reshape(-1, 4) * factor
        picture = draw_labelled_boxes(picture, truth, [""] * len(truth), [TRUTH_COLOUR] * len(truth))
    boxes = prediction["boxes"].detach().float().cpu().reshape(-1, 4)[chosen] * factor
    picture = draw_labelled_boxes(picture, boxes, [f"{class_name(class_names, c)} {s:.2f}"
                                                   for c, s in zip(labels, scores)], colours)
    return add_legend(picture, [(class_name(class_names, c), class_colour(c)) for c in sorted(set(labels))])


def truth_tiles(images: Any, targets: Any, count: int = 8) -> torch.Tensor | None:
    """TensorBoard's training samples: the first `count` images (floats in 0..1) with their ground-truth boxes in
    their classes' colours, as one grid; None when the images differ in size (no grid)."""
    tiles = []
    for image, target in list(zip(images, targets))[:count]:
        labels = [int(c) for c in target["labels"]]
        factor = enlargement(*image.shape[-2:], TENSORBOARD_LONG_SIDE)
        tile = enlarge(unit_to_uint8(image), factor)
        if "masks" in target and len(target["masks"]):
            tile = overlay_masks(tile, enlarge(target["masks"].cpu().bool(), factor), [class_colour(c) for c in labels])
        tiles.append(draw_labelled_boxes(tile, target["boxes"].detach().float().cpu() * factor,
                                         [class_name(None, c) for c in labels], [class_colour(c) for c in labels]))
    if not tiles or len({tuple(t.shape) for t in tiles}) != 1:
        return None
    return make_grid(torch.stack(tiles), nrow=4, padding=2)
