"""The wheels a GPU node without network needs for `make gpu-check` (`make gpu-bundle`), with a size report.

    python scripts/gpu_bundle.py [--out .whl] [--node-packages FILE] [--python-version 3.12]

Run on a machine with package access and this project's environment (make setup). Which distributions:
scripts/gpu_imports.py reads them off the gpu-check path's imports and keeps those the node lacks
(scripts/gpu_node_packages.txt, or FILE: the node's `pip list --format=freeze`), with their own requirements;
the versions are this environment's, the ones the tests ran with. Each is downloaded as a wheel for the
node's Python (CPython, manylinux x86-64); one published only as a source archive (antlr4-python3-runtime
4.9.3, which omegaconf pins) is built with `pip wheel`, and must come out pure Python (py3-none-any) to be of
use on another machine. OUT is emptied first; it then holds the wheels and bundle.json (names, versions,
sizes). The report adds the repository's tracked files, since both travel to the node together and the
limit (64 MiB by default) is on their sum: over it, the exit status is 1.

On the node, scripts/gpu_check.sh installs ./.whl/*.whl offline into a folder it appends to PYTHONPATH.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_imports  # noqa: E402  (this script's folder: run as a file, like the other scripts)

REPO = gpu_imports.REPO
LIMIT_MIB = 64.0
# pip matches a manylinux tag exactly: the ones a wheel for x86-64 Linux may carry, newest glibc first.
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]
MIB = 1024 * 1024


def download(dist: str, version: str, out: Path, python_version: str) -> Path:
    """The wheel of dist==version for the node's Python in `out`: downloaded, or built from the sdist."""
    before = set(out.glob("*.whl"))
    cp = "cp" + python_version.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp", "--abi", cp, "--abi", "abi3",
           "--abi", "none", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(out), f"{dist}=={version}"]
    got = subprocess.run(cmd, capture_output=True, text=True)
    if got.returncode != 0:
        # No wheel published for it: build one (pure Python only is of use on another machine).
        with tempfile.TemporaryDirectory() as tmp:
            built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", tmp,
                                    f"{dist}=={version}"], capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if built.returncode != 0 or not wheels:
                raise SystemExit(f"gpu_bundle: no wheel of {dist}=={version} for CPython {python_version} on "
                                 f"manylinux x86-64, and building one failed:\n{got.stderr[-1500:]}\n"
                                 f"{built.stderr[-1500:]}")
            if not wheels[0].name.endswith("-py3-none-any.whl") and not wheels[0].name.endswith("-py2.py3-none-any.whl"):
                raise SystemExit(f"gpu_bundle: {dist}=={version} has no wheel for the node and builds to "
                                 f"{wheels[0].name}, which is this machine's: build it on a machine like the node")
            shutil.move(str(wheels[0]), out / wheels[0].name)
    new = sorted(set(out.glob("*.whl")) - before)
    if len(new) != 1:
        raise SystemExit(f"gpu_bundle: expected one wheel of {dist}=={version} in {out}, found {new}")
    return new[0]


def tracked_bytes() -> int:
    """The size of the repository's tracked files (what travels to the node besides the wheels)."""
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return sum((REPO / name).stat().st_size for name in listing.decode().split("\0")
               if name and (REPO / name).is_file())


def report(wheels: dict[str, Path], repo_bytes: int, limit_mib: float) -> tuple[str, bool]:
    """The size table and whether the wheels and the repository fit under `limit_mib` together."""
    lines = ["| wheel | MiB |", "| --- | --- |"]
    total = 0
    for path in wheels.values():
        size = path.stat().st_size
        total += size
        lines.append(f"| {path.name} | {size / MIB:.2f} |")
    both = total + repo_bytes
    fits = both <= limit_mib * MIB
    lines += [f"| wheels together | {total / MIB:.2f} |", f"| repository (tracked files) | {repo_bytes / MIB:.2f} |",
              f"| **both** (limit {limit_mib:g}) | **{both / MIB:.2f}**{'' if fits else ' OVER THE LIMIT'} |"]
    return "\n".join(lines), fits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / ".whl", help="folder for the wheels (default: %(default)s)")
    parser.add_argument("--node-packages", type=Path, default=gpu_imports.GPU_NODE_PACKAGES,
                        help="what the GPU node has (default: %(default)s)")
    parser.add_argument("--python-version", default="3.12", help="the node's Python (default: %(default)s)")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB,
                        help="what may travel to the node: wheels plus repository (default: %(default)s)")
    args = parser.parse_args(argv)
    carry, _ = gpu_imports.split_by_node(gpu_imports.needed_distributions(),
                                         gpu_imports.node_packages(args.node_packages))
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    wheels = {dist: download(dist, version, args.out, args.python_version) for dist, version in carry.items()}
    table, fits = report(wheels, tracked_bytes(), args.limit_mib)
    (args.out / "bundle.json").write_text(json.dumps(
        {"python_version": args.python_version, "node_packages": str(args.node_packages),
         "wheels": {dist: {"version": carry[dist], "file": path.name, "bytes": path.stat().st_size}
                    for dist, path in wheels.items()}}, indent=1) + "\n")
    print(f"gpu_bundle: {len(wheels)} wheels for CPython {args.python_version} in {args.out}: "
          + ", ".join(f"{d}=={v}" for d, v in carry.items()))
    print(table)
    if not fits:
        print(f"gpu_bundle: the wheels and the repository exceed {args.limit_mib:g} MiB together", file=sys.stderr)
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
