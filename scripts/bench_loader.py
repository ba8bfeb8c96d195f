"""Training loader throughput and bytes per batch: workers that normalise (float32) against data.device_transforms
(uint8, normalised on the device), on 224-pixel crops of ImageFolder JPEGs, same run, alternating rounds, medians.

    python scripts/bench_loader.py                       # 256 JPEGs of 256x256 px, batch 32, 2 workers, 5 rounds
    python scripts/bench_loader.py --images 512 --rounds 7

Only the loader is timed (decode, RandomResizedCrop, flip, collate, and normalisation where the workers do it);
the device's share (copy, convert, normalise) is not, since without a GPU there is nothing to overlap it with.
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repository's src/

from PIL import Image  # noqa: E402

from src.config import data_config  # noqa: E402
from src.data import build_datasets, build_train_loader, set_loader_epoch  # noqa: E402
from src.data import shapes  # noqa: E402
from src.tasks import get_task  # noqa: E402

KINDS = 4


def write_folder(root: Path, images: int, side: int) -> None:
    """train/ and val/ ImageFolder trees of shapes JPEGs (quality 95) of side x side pixels."""
    for split, count in (("train", images), ("val", KINDS)):
        for index in range(count):
            img, label = shapes.make_classification_image(0, split, index, side, KINDS)
            path = root / split / shapes.SHAPE_NAMES[label] / f"{index:05d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(path, quality=95)


def epoch(loader, number: int) -> tuple[float, int, int]:
    """(seconds, images, bytes of the first batch's images) for one pass over the loader."""
    set_loader_epoch(loader, number)
    started, images, first = time.perf_counter(), 0, 0
    for batch_images, _, _ in loader:
        images += batch_images.shape[0]
        first = first or batch_images.numel() * batch_images.element_size()
    return time.perf_counter() - started, images, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256, help="training JPEGs")
    parser.add_argument("--side", type=int, default=256, help="side of the JPEGs in pixels")
    parser.add_argument("--crop", type=int, default=224, help="data.image_size (RandomResizedCrop)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_folder(Path(tmp), args.images, args.side)
        cfg = data_config(name="imagefolder", root=tmp, image_size=args.crop, batch_size=args.batch_size,
                          num_workers=args.workers, persistent_workers=True, num_classes=KINDS,
                          mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        loaders = {}
        for mode, on_device in (("float32 (workers normalise)", False), ("uint8 (device_transforms)", True)):
            bundle = build_datasets(cfg, get_task("classification").data, seed=0, device_transforms=on_device)
            loaders[mode] = build_train_loader(bundle.train, cfg, rank=0, world_size=1, seed=0)
            epoch(loaders[mode], 0)  # warm-up: workers started, files in the page cache
        rates: dict = {mode: [] for mode in loaders}
        sizes: dict = {}
        for r in range(args.rounds):
            for mode, loader in loaders.items():
                seconds, count, size = epoch(loader, r + 1)
                rates[mode].append(count / seconds)
                sizes[mode] = size
    base = statistics.median(rates["float32 (workers normalise)"])
    print(f"{args.images} JPEGs {args.side}x{args.side}, crop {args.crop}, batch {args.batch_size}, "
          f"{args.workers} workers, {args.rounds} rounds (medians)")
    print("| batches from the workers | images/s | ratio | bytes per batch |")
    print("|---|---|---|---|")
    for mode in loaders:
        med = statistics.median(rates[mode])
        print(f"| {mode} | {med:.0f} | {med / base:.2f} | {sizes[mode]:,} |")


if __name__ == "__main__":
    main()
