"""Loaders: augmentation from (seed, epoch, index) only, so batches do not depend on world size or workers."""
from __future__ import annotations

import pytest
import torch

from src.data import DataConfig, set_loader_epoch
from src.config import data_config
from tests.support.task_data import build_datasets, build_eval_loader, build_train_loader

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator


def _cfg(**kw: object) -> DataConfig:
    base = dict(name="shapes", train_size=48, val_size=23, num_classes=4, batch_size=4, eval_batch_size=5)
    base.update(kw)
    return data_config(**base)  # type: ignore[arg-type]


def _epoch_batches(loader: torch.utils.data.DataLoader, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    set_loader_epoch(loader, epoch)
    return [(x.clone(), y.clone()) for x, y, _ in loader]


def test_world_size_does_not_change_the_global_batches() -> None:
    cfg1 = _cfg(batch_size=6)
    bundle = build_datasets(cfg1, seed=11)
    ref = _epoch_batches(build_train_loader(bundle.train, cfg1, 0, 1, seed=11), epoch=2)
    for world_size in (2, 3):
        cfg = _cfg(batch_size=6 // world_size)
        per_rank = [_epoch_batches(build_train_loader(bundle.train, cfg, r, world_size, seed=11), epoch=2)
                    for r in range(world_size)]
        for k, (x_ref, y_ref) in enumerate(ref):
            x = torch.cat([p[k][0] for p in per_rank])
            y = torch.cat([p[k][1] for p in per_rank])
            assert torch.equal(x, x_ref) and torch.equal(y, y_ref), (world_size, k)


def test_num_workers_does_not_change_the_batches() -> None:
    bundle = build_datasets(_cfg(), seed=3)
    ref = _epoch_batches(build_train_loader(bundle.train, _cfg(), 0, 1, seed=3), epoch=1)
    with_workers = build_train_loader(bundle.train, _cfg(num_workers=2), 0, 1, seed=3)
    got = _epoch_batches(with_workers, epoch=1)
    assert len(got) == len(ref)
    for (x, y), (xr, yr) in zip(got, ref):
        assert torch.equal(x, xr) and torch.equal(y, yr)
    # The epoch reaches already-forked persistent workers through the sampled (epoch, index) pairs.
    persistent = build_train_loader(bundle.train, _cfg(num_workers=2, persistent_workers=True), 0, 1, seed=3)
    _epoch_batches(persistent, epoch=0)
    again = _epoch_batches(persistent, epoch=1)
    assert all(torch.equal(x, xr) for (x, _), (xr, _) in zip(again, ref))


def test_augmentation_varies_over_epochs_and_samples_but_not_reruns() -> None:
    bundle = build_datasets(_cfg(), seed=0)
    ds = bundle.train
    a = ds[(0, 5)][0]
    assert torch.equal(a, ds[(0, 5)][0])
    ds.set_epoch(0)
    assert torch.equal(a, ds[5][0])
    changed = sum(not torch.equal(ds[(e, 5)][0], a) for e in range(1, 9))
    assert changed >= 6, "random crop + flip leave an image unchanged only rarely (1/81 x 1/2 per epoch)"
    # The caller's global RNG is left as it was.
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ds[(1, 1)]
    assert torch.equal(torch.rand(3), expected)


def test_eval_loader_yields_indices_in_dataset_order() -> None:
    cfg = _cfg()
    bundle = build_datasets(cfg, seed=0)
    seen = []
    for world_size in (1, 2, 3):
        indices, labels = [], []
        for r in range(world_size):
            for x, y, idx in build_eval_loader(bundle.val, cfg, r, world_size):
                assert x.shape[1:] == (3, 32, 32) and idx.dtype == torch.int64
                indices += idx.tolist()
                labels += y.tolist()
        assert indices == list(range(23))
        seen.append(labels)
    assert seen[0] == seen[1] == seen[2]


def test_fused_normalisation_matches_torchvision() -> None:
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    from src.data.transforms import NormalizeUint8

    x = tv_tensors.Image(torch.randint(0, 256, (3, 9, 7), dtype=torch.uint8))
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    ref = v2.Normalize(mean, std)(v2.ToDtype(torch.float32, scale=True)(x))
    got, mask = NormalizeUint8(mean, std)(x, tv_tensors.Mask(torch.zeros(9, 7, dtype=torch.uint8)))
    # float32 rounding of two formulations of the same affine map: a few ulps of values up to ~2.6.
    torch.testing.assert_close(got, ref, rtol=0, atol=2e-6)
    assert isinstance(got, tv_tensors.Image) and mask.dtype == torch.uint8


def test_loader_workers_are_capped_to_the_cores_each_process_has(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """data.num_workers=8 with 2 cores and 2 processes on the node: 1 worker per process (torch warns above the
    cores), said once; the share follows the processes per node, at least 1; 0 stays 0."""
    from src.data import worker_cap as module

    monkeypatch.setattr(module, "available_cores", lambda: 2)
    monkeypatch.setattr(module, "_noted", set())
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with caplog.at_level("INFO", logger=module.__name__):
        assert [module.loader_workers(n) for n in (0, 1, 8, 8)] == [0, 1, 1, 1]
        loader = build_train_loader(build_datasets(_cfg(), seed=0).train, _cfg(num_workers=8), 0, 2, seed=0)
        assert loader.num_workers == 1
    assert [r.getMessage() for r in caplog.records] == [
        "data.num_workers=8: using 1 loader worker(s) per process, the share of the 2 CPU core(s) this process may use "
        "among the 2 process(es) on this node (more would compete with each other and with the model)"]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert module.loader_workers(8) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert module.loader_workers(8) == 1
