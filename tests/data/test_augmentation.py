"""data.auto_augment and data.random_erase: applied, seeded per (seed, epoch, index), world-size independent,
evaluation untouched, bad values refused before anything is built."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from src.data import DATASETS, DataConfig, set_loader_epoch
from src.models import MODELS
from src.tasks import all_tasks, model_tasks
from tests.support.task_data import build_datasets, build_train_loader
from src.config import data_config
from src.tasks.classification.options import AUTO_AUGMENT_POLICIES

POLICIES = [p for p in AUTO_AUGMENT_POLICIES if p != "none"]


def _cfg(**kw: object) -> DataConfig:
    base = dict(name="shapes", train_size=24, val_size=8, num_classes=4, batch_size=4, eval_batch_size=4)
    base.update(kw)
    return data_config(**base)  # type: ignore[arg-type]


def _train_images(cfg: DataConfig, seed: int = 5, epoch: int = 1) -> torch.Tensor:
    ds = build_datasets(cfg, seed=seed).train
    return torch.stack([ds[(epoch, i)][0] for i in range(len(ds))])


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_changes_the_training_images_and_is_repeatable(policy: str) -> None:
    plain = _train_images(_cfg())
    augmented = _train_images(_cfg(auto_augment=policy))
    assert augmented.shape == plain.shape and augmented.dtype == torch.float32
    changed = sum(not torch.equal(a, b) for a, b in zip(augmented, plain))
    # Each policy leaves an image as it was only when it draws Identity (or a zero magnitude): rarely.
    assert changed >= len(plain) * 2 // 3, f"{policy} changed only {changed} of {len(plain)} images"
    assert torch.equal(augmented, _train_images(_cfg(auto_augment=policy))), "not a function of (seed, epoch, index)"
    assert not torch.equal(augmented, _train_images(_cfg(auto_augment=policy), seed=6)), "seed ignored"
    assert not torch.equal(augmented, _train_images(_cfg(auto_augment=policy), epoch=2)), "epoch ignored"


def test_random_erase_sets_a_rectangle_to_zero_with_its_probability() -> None:
    plain = _train_images(_cfg())
    always = _train_images(_cfg(random_erase=1.0))
    for a, b in zip(always, plain):
        erased = (a != b).any(dim=0)
        assert erased.any() and (a[:, erased] == 0).all(), "erased pixels are the mean colour (0 after normalise)"
        rows, cols = erased.nonzero().unbind(1)  # the erased region is one rectangle
        box = erased[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
        assert box.float().mean() > 0.9  # ~all of its bounding box (a pixel may equal 0 already)
    never = _train_images(_cfg(random_erase=1e-9))
    assert torch.equal(never, plain)


def test_world_size_does_not_change_what_each_sample_becomes() -> None:
    """2 ranks with batch 2 see, between them, exactly the global batches of 1 rank with batch 4."""
    cfg1 = _cfg(auto_augment="randaugment", random_erase=0.5, batch_size=4)
    bundle = build_datasets(cfg1, seed=11)

    def batches(cfg: DataConfig, rank: int, world: int) -> list[torch.Tensor]:
        loader = build_train_loader(bundle.train, cfg, rank, world, seed=11)
        set_loader_epoch(loader, 3)
        return [x for x, _, _ in loader]

    ref = batches(cfg1, 0, 1)
    cfg2 = _cfg(auto_augment="randaugment", random_erase=0.5, batch_size=2)
    ranks = [batches(cfg2, r, 2) for r in range(2)]
    assert len(ref) == len(ranks[0]) == len(ranks[1]) > 0
    for k, x in enumerate(ref):
        assert torch.equal(torch.cat([ranks[0][k], ranks[1][k]]), x), k


def test_evaluation_is_untouched() -> None:
    plain = build_datasets(_cfg(), seed=5).val
    strong = build_datasets(_cfg(auto_augment="trivialaugment", random_erase=1.0), seed=5).val
    for i in range(len(plain)):
        assert torch.equal(plain[i][0], strong[i][0])


@pytest.mark.parametrize("kw, match", [
    (dict(auto_augment="randaug"), "data.auto_augment must be one of none, randaugment"),
    (dict(random_erase=1.5), r"data.random_erase is a probability in \[0, 1\]"),
    (dict(random_erase=-0.1), "data.random_erase"),
    (dict(auto_augment="autoaugment", augment=False), "data.augment=false"),
])
def test_bad_values_are_refused(kw: dict, match: str) -> None:
    from src.config import validate_config

    with pytest.raises(ValueError, match=match):
        validate_config({"data": dataclasses.asdict(_cfg(**kw))})


# A model and a dataset of each task that does not read these keys (every such task's first registered ones).
OTHER_TASKS = [(next(m.name for m in MODELS if t.name in model_tasks(m.name)), DATASETS.names(t.name)[0], t.name)
               for t in all_tasks() if "auto_augment" not in {f.name for o in t.config_options.values()
                                                               for f in dataclasses.fields(o)}
               and any(t.name in model_tasks(m.name) for m in MODELS) and DATASETS.names(t.name)]


@pytest.mark.parametrize("model, data, task", OTHER_TASKS)
@pytest.mark.parametrize("kw", [dict(auto_augment="randaugment"), dict(random_erase=0.25)])
def test_other_tasks_refuse_them(kw: dict, model: str, data: str, task: str) -> None:
    from src.config import validate_config

    (key, value), = kw.items()
    with pytest.raises(ValueError, match=f"data.{key}={value!r} is not read by this run's task, {task}"):
        validate_config({"model": {"name": model}, "data": {"name": data, **kw}})


def test_the_recipe_that_uses_them_composes_and_validates() -> None:
    """Composed through Hydra like a run: conf/experiment/imagenet_resnet50_v2.yaml sets both keys."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from src.config import validate_config

    conf = str(Path(__file__).resolve().parents[2] / "conf")
    with initialize_config_dir(config_dir=conf, version_base=None):
        cfg = compose("train", overrides=["experiment=imagenet_resnet50_v2"])
    cfg = validate_config(cfg)
    assert (cfg.data.auto_augment, cfg.data.random_erase) == ("trivialaugment", 0.1)
