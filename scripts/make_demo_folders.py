"""Write the example image folders that docs/data.md trains and predicts on: one tree per dataset that reads
such a tree (src/data/demo_folders.py), e.g. demo/classify (6,600 JPEGs in class folders for data=imagefolder).

    python scripts/make_demo_folders.py demo
    python scripts/make_demo_folders.py demo --train 8 --val 2     # small trees (per class for class folders)
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repository's src/

import src.data  # noqa: E402,F401  (registers every dataset, and with them their example trees)
from src.commands.user_errors import reported  # noqa: E402  (a user's mistake: one message, exit 2)
from src.data.demo_folders import demo_folders  # noqa: E402


@reported
def main() -> None:
    """Parse the output folder and the sizes, write every tree, say where each is."""
    demos = demo_folders()
    sizes = "; ".join(f"{d.folder}: {d.train} / {d.val} {d.unit}" for d in demos.values())
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write the example folders into")
    parser.add_argument("--train", type=int, help=f"training size of every tree (defaults: {sizes})")
    parser.add_argument("--val", type=int, help="validation size of every tree, in the same units")
    args = parser.parse_args()
    for name, demo in demos.items():
        root = demo.write(args.out, args.train or demo.train, args.val or demo.val, 0)
        print(f"wrote {root} (data={name} data.root={root})")


if __name__ == "__main__":
    main()
