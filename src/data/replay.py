"""A v2 training transform split in two: its random choices drawn where the sample's seed is (the loader),
its image work replayed later on the decoded image (data.decode_on_device, src/data/device_decode.py).

`Recorder(transform).record(shape, target)` runs the transform, under whatever RNG state the caller set
(SeededTransformDataset's per-sample seed), on a stand-in image of the real image's shape on PyTorch's
"meta" device: every operation computes its output's shape but touches no pixels, and draws exactly
what it would draw on the real image (v2 transforms draw their parameters from torch's CPU generator,
from the image's size, never from its pixels). Each operation that would change the image is recorded
as (leaf index, kind, arguments), with the transformed target. `replay(transform, plan, image)` then
applies those operations to the real image in order, drawing nothing: it needs no RNG, so it may run on
any thread (a training process's global RNG is the training thread's: MixUp/CutMix draw from it, a
checkpoint saves it) and it gives the image the transform would have given under that seed.

Leaves are the transform's v2 modules that are not containers (Compose, RandomApply, RandomChoice,
RandomOrder), numbered depth first: the same numbering in the loader's copy of the transform
(a worker process's) and in the training process's. The AutoAugment family draws inside `forward` and
applies one method, `_apply_image_or_video_transform`, which is what is recorded for them; the others
apply `transform(image, params)`.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

_CONTAINERS = (v2.Compose, v2.RandomApply, v2.RandomChoice, v2.RandomOrder)
_AUTO_AUGMENT = (v2.AutoAugment, v2.RandAugment, v2.TrivialAugmentWide, v2.AugMix)


class Step(NamedTuple):
    """One recorded operation: which leaf, how it is applied ("transform" or "auto_augment"), its arguments."""

    leaf: int
    kind: str
    args: tuple


def _pipeline(transform: Any) -> torch.nn.Module:
    """The v2 module of `transform` (a PairTransform's pipeline, or a v2 module itself)."""
    module = getattr(transform, "pipeline", transform)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"data.decode_on_device replays a torchvision v2 pipeline; got {type(module).__name__}")
    return module


def _walk(module: Any) -> Iterator[Any]:
    """`module` and everything inside it, depth first: v2's containers keep theirs in a plain list
    (`transforms`), not as registered submodules."""
    yield module
    inner = getattr(module, "transforms", None) if isinstance(module, _CONTAINERS) else None
    for child in inner if inner is not None else (module.children() if isinstance(module, torch.nn.Module) else ()):
        yield from _walk(child)


def leaves(transform: Any) -> list[v2.Transform]:
    """The transform's operations that may change an image, in a fixed order (the plan's leaf numbers)."""
    return [m for m in _walk(_pipeline(transform)) if isinstance(m, v2.Transform) and not isinstance(m, _CONTAINERS)]


class Recorder:
    """Draws a transform's random choices on a stand-in image of the real one's shape and records them.

    Keeps its own copy of the transform, whose leaves are wrapped to record: the caller's transform stays as it
    was (another thread may be replaying with it).
    """

    def __init__(self, transform: Callable[..., Any]) -> None:
        self.transform = copy.deepcopy(transform)
        self._plan: list[Step] = []
        for index, leaf in enumerate(leaves(self.transform)):
            if isinstance(leaf, _AUTO_AUGMENT):
                leaf._apply_image_or_video_transform = self._wrap(index, "auto_augment",
                                                                  leaf._apply_image_or_video_transform)
            else:
                leaf.transform = self._wrap(index, "transform", leaf.transform)

    def _wrap(self, index: int, kind: str, apply: Callable[..., Any]) -> Callable[..., Any]:
        def record(image: Any, *args: Any, **kwargs: Any) -> Any:
            out = apply(image, *args, **kwargs)  # on the meta stand-in: shapes only
            if isinstance(image, torch.Tensor) and image.device.type == "meta":
                # auto_augment: (op name, magnitude); interpolation and fill are the leaf's own, read at replay
                self._plan.append(Step(index, kind, tuple(args)))
            return out
        return record

    def record(self, shape: tuple[int, ...], target: Any) -> tuple[list[Step], Any]:
        """(plan, transformed target) of the transform on a uint8 image of `shape` under the current RNG state."""
        self._plan = []
        stand_in = tv_tensors.Image(torch.empty(shape, dtype=torch.uint8, device="meta"))
        _, target = self.transform(stand_in, target)
        plan, self._plan = self._plan, []
        return plan, target


def replay(transform: Any, plan: list[Step], image: torch.Tensor) -> torch.Tensor:
    """`image` (uint8 [3, H, W], any device) with the plan's operations applied: the transform's output for
    the draws the plan recorded. Draws nothing from any RNG."""
    ops = leaves(transform)
    out: Any = tv_tensors.Image(image)
    for step in plan:
        leaf = ops[step.leaf]
        if step.kind == "auto_augment":
            out = leaf._apply_image_or_video_transform(out, *step.args, interpolation=leaf.interpolation,
                                                       fill=leaf._fill)
        else:
            out = leaf.transform(out, *step.args)
    return out.as_subclass(torch.Tensor)
