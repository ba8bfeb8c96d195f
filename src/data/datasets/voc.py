"""Pascal VOC 2012 segmentation (`data=voc`) from torchvision: <root>/VOCdevkit/VOC2012/..."""
from __future__ import annotations

from torch.utils.data import Dataset
from torchvision import datasets
from torchvision.datasets.voc import DATASET_YEAR_DICT

from src.data.config import DataConfig
from src.data.download import explained_download, guarded, missing_download_message, resolve_root
from src.data.registry import DATASETS, Splits
from src.data.segmentation.masks import TensorPairs
from src.errors import MissingFileError

VOC_CLASSES = [
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
]


@DATASETS.register("voc", task="segmentation", num_classes=len(VOC_CLASSES), download=True, varying_sizes=True)
def build_voc(cfg: DataConfig) -> Splits:
    """data.root is the folder that holds VOCdevkit/ (torchvision's layout); 255 = the "void" border."""
    root = resolve_root(cfg.root)
    voc_root = root / "VOCdevkit" / "VOC2012"

    def build() -> tuple[Dataset, Dataset]:
        present = voc_root.is_dir()
        if not present and not cfg.download:
            raise MissingFileError(
                missing_download_message("Pascal VOC 2012", voc_root, downloadable=True)
                + " (JPEGImages/, SegmentationClass/, ImageSets/Segmentation/{train,val}.txt); data.root is "
                "the folder that holds VOCdevkit/")
        for split in (cfg.train_split, cfg.val_split):
            if present and not (voc_root / "ImageSets" / "Segmentation" / f"{split}.txt").is_file():
                raise MissingFileError(f"Pascal VOC split list {voc_root.resolve()}/ImageSets/Segmentation/{split}.txt "
                                       "not found; data.train_split/val_split must name one of train, val, trainval")
        # torchvision re-extracts the 2 GB archive whenever download=True, so only ask when it is absent.
        download = cfg.download and not present
        with explained_download("Pascal VOC 2012", DATASET_YEAR_DICT["2012"]["url"], root, voc_root):
            train = datasets.VOCSegmentation(str(root), year="2012", image_set=cfg.train_split, download=download)
        val = datasets.VOCSegmentation(str(root), year="2012", image_set=cfg.val_split, download=False)
        return train, val

    train, val = guarded(build)
    return Splits(TensorPairs(train.images, train.masks), TensorPairs(val.images, val.masks), list(VOC_CLASSES),
                  val_same_size=False)
