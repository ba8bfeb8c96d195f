"""MixUp / CutMix of classification's training batches (torchvision.transforms.v2)."""
from __future__ import annotations

from typing import Callable, Optional

from typing import Any


def build_mix(settings: Any, num_classes: int) -> Optional[Callable]:
    """MixUp and/or CutMix (one of them per batch when both are on) of `settings.mixup_alpha` and
    `settings.cutmix_alpha`; None when both alphas are 0."""
    if settings.mixup_alpha <= 0 and settings.cutmix_alpha <= 0:
        return None
    from torchvision.transforms import v2

    choices = []
    if settings.mixup_alpha > 0:
        choices.append(v2.MixUp(alpha=settings.mixup_alpha, num_classes=num_classes))
    if settings.cutmix_alpha > 0:
        choices.append(v2.CutMix(alpha=settings.cutmix_alpha, num_classes=num_classes))
    return choices[0] if len(choices) == 1 else v2.RandomChoice(choices)
