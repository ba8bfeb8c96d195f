"""Write the example image folders that docs/data.md trains and predicts on: demo/classify (6,600 JPEGs in class
folders) and, for segmentation, demo/segment (2,300 image/mask pairs); 46 MB in all.

    python scripts/make_demo_folders.py demo
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repository's src/

from src.data.demo_folders import write_classify, write_segment  # noqa: E402


def main() -> None:
    """Parse the output folder and the sizes, write both trees, say where they are."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write the example folders into")
    parser.add_argument("--train-per-class", type=int, default=1000, help="classify: training images per class")
    parser.add_argument("--val-per-class", type=int, default=100, help="classify: validation images per class")
    # part: segmentation
    parser.add_argument("--train-images", type=int, default=2000, help="segment: training image/mask pairs")
    parser.add_argument("--val-images", type=int, default=300, help="segment: validation image/mask pairs")
    # /part
    args = parser.parse_args()
    classify = write_classify(args.out, args.train_per_class, args.val_per_class)
    print(f"wrote {classify} (data=imagefolder data.root={classify})")
    # part: segmentation
    segment = write_segment(args.out, args.train_images, args.val_images)
    print(f"wrote {segment} (data=segfolder data.root={segment})")
    # /part


if __name__ == "__main__":
    main()
