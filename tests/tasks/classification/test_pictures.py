"""Classification's TensorBoard pictures: a grid framed by right and wrong predictions."""
from __future__ import annotations

import torch


def test_classification_grid_frames_right_and_wrong(writer) -> None:
    from src.tasks.classification.pictures import log_classification_grid

    images = torch.randn(3, 3, 6, 6)
    log_classification_grid(writer, images, 1, targets=torch.tensor([0, 1, 2]), preds=torch.tensor([0, 2, 2]),
                            mean=[0.5] * 3, std=[0.25] * 3, nrow=3)
    grid = writer.images[0][1]
    assert grid.dtype == torch.uint8 and grid.shape == (3, 2 + 10 + 2, 2 + 3 * (10 + 2))
    assert grid[:, 2, 2].tolist() == [0, 200, 0] and grid[:, 2, 14].tolist() == [220, 0, 0]
