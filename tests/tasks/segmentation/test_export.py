"""export.py on a segmenter: tests/commands/test_export.py's checks (every format computes the checkpoint's model
at two batch sizes and another image size; SyncBN reverted with its statistics) on a narrow DeepLabV3+, and one
logit per pixel at the input's size."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.commands.test_export import (Checkpoint, _export, reference, test_exported_file_computes_the_checkpoint_model,  # noqa: F401
                                        test_syncbn_is_reverted_and_running_statistics_kept, written_checkpoint)

pytestmark = pytest.mark.usefixtures("one_thread")  # reference forwards on one thread (conftest.py)
MODELS = {
    # The segmentation demo's DeepLabV3+ (stride-2 decoder stage, aux head) made narrow: a small segmenter.
    "segmenter": ["experiment=shapes_seg_deeplabv3plus", "model.head_channels=16", "data.image_size=48",
                  "data.crop_size=48", "trainer.amp=none"],
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return written_checkpoint(request.param, MODELS[request.param], tmp_path_factory)


def test_one_logit_per_pixel_at_the_input_size(checkpoint: Checkpoint, reference: tuple, tmp_path: Path) -> None:
    _, ckpt, _, _ = checkpoint
    _, cases = reference
    scripted = torch.jit.load(str(_export(ckpt, "torchscript", tmp_path / "model.pt")))
    with torch.no_grad():
        assert scripted(cases[2]).shape[-2:] == cases[2].shape[-2:]
