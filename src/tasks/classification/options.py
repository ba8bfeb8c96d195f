"""The keys classification adds to the config groups (src/dataclass_config.py, `extend`): its training loss and
batch mixing (trainer.*), its augmentation (data.*) and predict.py's table (topk). Each is checked here; a run of
another task refuses them when set."""
from __future__ import annotations

from dataclasses import dataclass

AUTO_AUGMENT_POLICIES = ("none", "randaugment", "trivialaugment", "autoaugment")


@dataclass
class ClassificationTraining:
    """trainer.*: what the loss and the batch mixing read (Classification.options hands this to them)."""

    label_smoothing: float = 0.0
    mixup_alpha: float = 0.0  # MixUp of each batch and its labels (0 = off)
    cutmix_alpha: float = 0.0  # CutMix (0 = off); with both on, one of them per batch

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"trainer.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        for key in ("mixup_alpha", "cutmix_alpha"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"trainer.{key} must be >= 0, got {getattr(self, key)}")


@dataclass
class ClassificationData:
    """data.*: classification's augmentation and evaluation crop."""

    random_crop: bool = True  # CIFAR/shapes: RandomCrop(image_size, padding=crop_padding); ImageNet: RandomResizedCrop
    crop_padding: int = 4
    resize_size: int = 256  # images of varying sizes (imagefolder) are evaluated Resize(resize_size), CenterCrop(image_size)
    # Automatic augmentation policy after crop / flip / jitter (torchvision.transforms.v2, default settings):
    # randaugment | trivialaugment | autoaugment (the ImageNet policy) | none.
    auto_augment: str = "none"
    # Probability of v2.RandomErasing on the normalised image (0 = off; timm's --reprob, torchvision's
    # references' --random-erase, both use 0.25).
    random_erase: float = 0.0

    def validate(self) -> None:
        """Raise ValueError naming the bad key (checks that need the rest of the data group: Classification)."""
        if not isinstance(self.crop_padding, int) or isinstance(self.crop_padding, bool) or self.crop_padding < 0:
            raise ValueError(f"data.crop_padding must be an integer >= 0, got {self.crop_padding!r}")
        if self.auto_augment not in AUTO_AUGMENT_POLICIES:
            raise ValueError(f"data.auto_augment must be one of {', '.join(AUTO_AUGMENT_POLICIES)}, "
                             f"got {self.auto_augment!r}")
        erase = self.random_erase
        if isinstance(erase, bool) or not isinstance(erase, (int, float)) or not 0 <= erase <= 1:
            raise ValueError(f"data.random_erase is a probability in [0, 1] (0 = off), got {erase!r}")


@dataclass
class ClassificationPredict:
    """predict.py's key for classification."""

    topk: int = 5  # classes per row of predictions.csv, most probable first (capped at the number of classes)

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        if isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1:
            raise ValueError(f"topk must be an integer >= 1, got {self.topk!r}")
