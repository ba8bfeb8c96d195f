"""Cost per sample of data=shapes_det on one core: generating a scene with its boxes (what the cache saves after
the first epoch), and the training transform (flip, float32, sanitise: paid every epoch). Several rounds, medians;
also the boxes per image and the share of drawn shapes left without a box (under 16 visible pixels).

    python scripts/bench_shapes_det.py                    # 96 and 128 px, 300 images, 5 rounds
    python scripts/bench_shapes_det.py --sizes 64 96 --images 500 --rounds 7
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repository's src/

import torch  # noqa: E402

from src.data.config import DataConfig  # noqa: E402
from src.data.datasets.shapes import drawing  # noqa: E402
from src.data.datasets.shapes.datasets import ShapesDetection  # noqa: E402
from src.data.seeded import SeededTransformDataset  # noqa: E402
from src.tasks.detection.transforms import detection_train_transform  # noqa: E402


def per_sample_ms(dataset, count: int) -> float:
    started = time.perf_counter()
    for i in range(count):
        dataset[i]
    return (time.perf_counter() - started) / count * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[96, 128], help="data.image_size values")
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = DataConfig(name="shapes_det")  # the conf/data/shapes_det.yaml scene settings, repeated below
    print("| image_size | generate (ms/image, uncached) | train transform (ms/sample, cached) | boxes/image | "
          "shapes without a box |")
    print("|---|---|---|---|---|")
    for size in args.sizes:
        common = dict(image_size=size, num_shape_kinds=4, min_shapes=2, max_shapes=5, radius_range=(0.12, 0.25))
        generate, transform = [], []
        cached = ShapesDetection(0, "train", args.images, cache=True, **common)
        per_sample_ms(cached, args.images)  # fill the cache
        train = SeededTransformDataset(cached, detection_train_transform(cfg), seed=0)
        for r in range(args.rounds):
            generate.append(per_sample_ms(ShapesDetection(r + 1, "train", args.images, cache=False, **common),
                                          args.images))
            transform.append(per_sample_ms(train, args.images) - per_sample_ms(cached, args.images))
        boxes = sum(len(cached[i][1]["labels"]) for i in range(args.images))
        drawn = sum(len(drawing.make_instance_image(0, "train", i, size, 4, 2, 5, radius_range=(0.12, 0.25))[2])
                    for i in range(args.images))
        print(f"| {size} | {statistics.median(generate):.2f} | {statistics.median(transform):.2f} | "
              f"{boxes / args.images:.2f} | {100 * (1 - boxes / drawn):.1f}% |")


if __name__ == "__main__":
    main()
