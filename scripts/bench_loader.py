"""Training input throughput, images/s to the device: workers that normalise (float32), data.device_transforms
(uint8, normalised on the device) and data.decode_on_device (the device decodes and augments, on the producer
thread), on 224-pixel crops of ImageFolder JPEGs, same run, alternating rounds, medians.

    python scripts/bench_loader.py                       # 256 JPEGs of 256x256 px, batch 32, 2 workers, 5 rounds
    python scripts/bench_loader.py --images 512 --rounds 7
    python scripts/bench_loader.py --device cuda --json loader.json    # make gpu-check runs this on a GPU
    python scripts/bench_loader.py --loader-only                      # the loader alone (the workers' share)

An epoch is timed from the loader's start to the last batch on the device, as the trainer receives them
(prefetch: the copy, or decoding and augmenting, one batch ahead); on CUDA the device is synchronised once
at the end of each epoch, not per batch. Without a GPU (--device cpu), decode_on_device runs its CUDA path's
CPU twin: a check that it works and what it costs there, not a prediction for a GPU.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repository's src/

import torch  # noqa: E402
from PIL import Image  # noqa: E402

from src.config import data_config  # noqa: E402
from src.data import build_datasets, build_train_loader, set_loader_epoch  # noqa: E402
from src.data.batch import Batch  # noqa: E402
from src.data.datasets.shapes import drawing  # noqa: E402
from src.data.device_transforms import prefetch  # noqa: E402
from src.tasks import get_task  # noqa: E402

KINDS = 4
MODES = {  # name -> (data.device_transforms, data.decode_on_device)
    "float32 (workers normalise)": (False, False),
    "uint8 (device_transforms)": (True, False),
    "bytes (decode_on_device)": (True, True),
}


def write_folder(root: Path, images: int, side: int) -> None:
    """train/ and val/ ImageFolder trees of shapes JPEGs (quality 95) of side x side pixels."""
    for split, count in (("train", images), ("val", KINDS)):
        for index in range(count):
            img, label = drawing.make_classification_image(0, split, index, side, KINDS)
            path = root / split / drawing.SHAPE_NAMES[label] / f"{index:05d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(path, quality=95)


def epoch(loader, number: int, move, device: torch.device, threaded: bool) -> tuple[float, int, int]:
    """(seconds, images, bytes of the first batch the loader handed over) for one pass to the device; with
    move None, for one pass over the loader alone."""
    set_loader_epoch(loader, number)
    started, images, first = time.perf_counter(), 0, 0
    sizes = []

    def counted():
        for batch in loader:
            sizes.append(sum(t.numel() * t.element_size() for t in getattr(batch.images, "data", [batch.images])))
            yield batch

    if move is None:
        images = sum(len(getattr(batch.images, "data", batch.images)) for batch in counted())
    for batch in (prefetch(counted(), move, device, threaded=threaded) if move is not None else ()):
        images += batch.images.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first = sizes[0] if sizes else 0
    return time.perf_counter() - started, images, first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256, help="training JPEGs")
    parser.add_argument("--side", type=int, default=256, help="side of the JPEGs in pixels")
    parser.add_argument("--crop", type=int, default=224, help="data.image_size (RandomResizedCrop)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="where batches go: cpu or cuda (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="write the medians here")
    parser.add_argument("--loader-only", action="store_true",
                        help="time the loader alone: nothing moved to the device, decoded or augmented there")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_loader: --device cuda but no CUDA GPU is visible", file=sys.stderr)
        return 2
    rates: dict = {mode: [] for mode in MODES}
    sizes: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        write_folder(Path(tmp), args.images, args.side)
        cfg = data_config(name="imagefolder", root=tmp, image_size=args.crop, batch_size=args.batch_size,
                          num_workers=args.workers, persistent_workers=True, num_classes=KINDS,
                          mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        runs = {}
        for mode, (on_device, decode) in MODES.items():
            cfg.device_transforms, cfg.decode_on_device = on_device, decode
            bundle = build_datasets(cfg, get_task("classification").data, seed=0, device_transforms=on_device)
            loader = build_train_loader(bundle.train, cfg, rank=0, world_size=1, seed=0)
            move = (None if args.loader_only else
                    partial(Batch.to, device=device, dtype=torch.float32, transform=bundle.device_transform))
            runs[mode] = (loader, move, decode)
            epoch(loader, 0, move, device, decode)  # warm-up: workers started, files in the page cache, CUDA ready
        for r in range(args.rounds):
            for mode, (loader, move, decode) in runs.items():
                seconds, count, size = epoch(loader, r + 1, move, device, decode)
                rates[mode].append(count / seconds)
                sizes[mode] = size
    base = statistics.median(rates["float32 (workers normalise)"])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{args.images} JPEGs {args.side}x{args.side}, crop {args.crop}, batch {args.batch_size}, "
          f"{args.workers} workers, {'the loader alone' if args.loader_only else 'to ' + name}, "
          f"{args.rounds} rounds (medians)")
    print("| batches from the workers | images/s | ratio | bytes per batch from the workers |")
    print("|---|---|---|---|")
    for mode in MODES:
        med = statistics.median(rates[mode])
        print(f"| {mode} | {med:.0f} | {med / base:.2f} | {sizes[mode]:,} |")
    if args.json:
        args.json.write_text(json.dumps({
            "device": name, "images": args.images, "side": args.side, "crop": args.crop,
            "batch_size": args.batch_size, "workers": args.workers, "rounds": args.rounds,
            "images_per_s": {mode: statistics.median(rates[mode]) for mode in MODES},
            "rounds_images_per_s": rates, "bytes_per_batch": sizes}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
