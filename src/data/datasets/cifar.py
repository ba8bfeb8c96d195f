"""CIFAR-10 and CIFAR-100 from torchvision: downloaded under data.root on local rank 0 first when data.download."""
from __future__ import annotations

from torch.utils.data import Dataset
from torchvision import datasets

from src.data.config import DataConfig
from src.data.download import explained_download, guarded, missing_download_message, resolve_root
from src.data.registry import DATASETS, Splits
from src.errors import MissingFileError, UserError


@DATASETS.register("cifar100", task="classification", num_classes=100, download=True)
@DATASETS.register("cifar10", task="classification", num_classes=10, download=True)
def build_cifar(cfg: DataConfig) -> Splits:
    """torchvision's "python version" batches under <root>/cifar-10-batches-py or <root>/cifar-100-python."""
    cls = datasets.CIFAR10 if cfg.name == "cifar10" else datasets.CIFAR100
    root = resolve_root(cfg.root)
    folder = root / cls.base_folder
    files = [name for name, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]

    def build() -> tuple[Dataset, Dataset]:
        missing = [f for f in files if not (folder / f).is_file()]
        if missing and not cfg.download:
            raise MissingFileError(
                missing_download_message(cfg.name, folder, downloadable=True)
                + f" (missing: {', '.join(missing)}; torchvision expects the python version of the batches)")
        try:
            with explained_download(cfg.name, cls.url, root, folder):
                train = cls(str(root), train=True, download=cfg.download)
            val = cls(str(root), train=False, download=False)
        except RuntimeError as exc:  # torchvision's MD5 check failed
            raise UserError(f"{cfg.name} files under {folder.resolve()} failed torchvision's checksum check "
                            f"({exc}); delete the folder and set data.download=true, or restore the files") from exc
        return train, val

    train, val = guarded(build)
    return Splits(train, val, list(train.classes))
