"""src/data/replay.py: a training transform's random choices drawn on a meta-device stand-in (no pixels) and
replayed on the real image give exactly the transform's own output under the same seed, for every policy
and the geometric, photometric and erasing steps; the replay draws nothing from the global RNG."""
from __future__ import annotations

import pytest
import torch

from src.config import data_config
from src.data.replay import Recorder, leaves, replay
from src.tasks.classification.transforms import classification_train_transform

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator


def _transform(policy: str):
    cfg = data_config(name="imagefolder", root="unused", image_size=24, resize_size=28, auto_augment=policy,
                     random_erase=0.5, color_jitter=0.3, device_transforms=True, decode_on_device=True)
    return classification_train_transform(cfg, on_device=True)


@pytest.mark.parametrize("policy", ["none", "trivialaugment", "randaugment", "autoaugment"])
def test_replay_gives_the_transforms_own_output(policy: str) -> None:
    transform = _transform(policy)
    recorder = Recorder(transform)
    image = torch.randint(0, 256, (3, 37, 45), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    kinds = set()
    for seed in range(8):
        torch.manual_seed(seed)
        plan, target = recorder.record((3, 37, 45), 7)
        torch.manual_seed(seed)
        expected, expected_target = transform(image, 7)
        state = torch.get_rng_state()
        got = replay(transform, plan, image)
        assert torch.equal(torch.get_rng_state(), state)  # replay draws nothing
        assert got.dtype == torch.uint8 and torch.equal(got, expected), (policy, seed, plan)
        assert target.target == expected_target.target and torch.equal(target.box, expected_target.box)
        kinds |= {type(leaves(transform)[step.leaf]).__name__ for step in plan}
    assert {"RandomResizedCrop", "ColorJitter"} <= kinds  # the plans are not empty
    if policy != "none":
        assert any(name.endswith(("Augment", "AugmentWide")) for name in kinds), kinds


def test_the_recorder_leaves_the_callers_transform_alone() -> None:
    transform = _transform("trivialaugment")
    Recorder(transform)
    assert all("transform" not in vars(leaf) and "_apply_image_or_video_transform" not in vars(leaf)
               for leaf in leaves(transform))
