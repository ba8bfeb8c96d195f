"""The repository's Dockerfile, built (on the local Debian base) and run: train, evaluate, predict, inspect.

What docs/clusters.md promises of the image, checked on the image itself: the documented
`docker run IMAGE --standalone --nproc_per_node=2 train.py ...` form trains on 2 processes as the
image's non-root user and writes metrics, TensorBoard events and checkpoints to a mounted folder,
owned by the user given at build time; evaluate.py and predict.py run on that checkpoint; the SyncBN
kernels are the ones compiled at build time; no build caches or credentials ship.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from tests.docker.conftest import HOST_GID, HOST_UID, BuiltImage, TrainedRun

# The first test also waits for the session's fixtures: on a fresh machine the base image
# (debootstrap, about 3 GB of wheels) and the image build take far longer than pytest.ini's 900 s.
pytestmark = [pytest.mark.docker, pytest.mark.timeout(5400)]

APP_DIR = "/opt/synctrain"
EXTENSIONS_DIR = f"{APP_DIR}/build/torch_extensions"
MAX_IMAGE_BYTES = 12 * 1024**3  # torch + nvidia-* wheels are ~6 GB; far above means something leaked in


def _tail(proc) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-5000:]}\n--- stderr\n{proc.stderr[-5000:]}"


def test_default_job_trains_on_two_processes_into_the_mount(trained_run: TrainedRun) -> None:
    assert trained_run.proc.returncode == 0, _tail(trained_run.proc)
    metrics = [json.loads(line) for line in (trained_run.run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [m["step"] for m in metrics if m["split"] == "train"]
    assert train_steps and max(train_steps) == 4, f"expected 4 optimizer steps, got {train_steps}"
    assert any(m["split"] == "val" for m in metrics), "no validation metrics"
    assert (trained_run.run_dir / "checkpoints" / "last.pt").is_file()
    events = list(trained_run.run_dir.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard events under {trained_run.run_dir}"
    # Both ranks ran: rank 1 logs too (to its own file), and the summary counts 2 processes.
    assert (trained_run.run_dir / "logs" / "rank1.log").is_file()


def test_outputs_belong_to_the_build_time_user(trained_run: TrainedRun) -> None:
    assert trained_run.proc.returncode == 0, _tail(trained_run.proc)
    wrong = []
    for path in [trained_run.run_dir, *trained_run.run_dir.rglob("*")]:
        st = path.lstat()
        if (st.st_uid, st.st_gid) != (HOST_UID, HOST_GID):
            wrong.append(f"{path} {st.st_uid}:{st.st_gid}")
    assert not wrong, f"not owned by {HOST_UID}:{HOST_GID}:\n" + "\n".join(wrong[:20])


def test_evaluate_and_predict_on_the_checkpoint(built_image: BuiltImage, trained_run: TrainedRun) -> None:
    assert trained_run.proc.returncode == 0, _tail(trained_run.proc)
    outputs = trained_run.outputs
    inputs = outputs / "inputs"
    inputs.mkdir()
    from PIL import Image

    for i, color in enumerate([(255, 0, 0), (0, 128, 255), (20, 200, 20)]):
        Image.new("RGB", (40, 32), color).save(inputs / f"image{i}.png")
    os.chown(inputs, HOST_UID, HOST_GID)

    proc = built_image.run(["python3", "evaluate.py", "ckpt=/outputs/run/checkpoints/last.pt",
                            "out=/outputs/eval.json"], mounts={outputs: "/outputs"})
    assert proc.returncode == 0, _tail(proc)
    metrics = json.loads((outputs / "eval.json").read_text())
    assert 0.0 <= metrics["top1"] <= 100.0 or 0.0 <= metrics["top1"] <= 1.0, metrics

    proc = built_image.run(["python3", "predict.py", "ckpt=/outputs/run/checkpoints/last.pt",
                            "input=/outputs/inputs", "out=/outputs/predictions"], mounts={outputs: "/outputs"})
    assert proc.returncode == 0, _tail(proc)
    with open(outputs / "predictions" / "predictions.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3, rows


# Run in the image: load the kernels the way training does and report the loader's build info and
# what the build left behind. (Hiding the compiler through CXX would not do: CXX is part of the
# variants' cache key, so the loader would look for another variant.)
_KERNEL_CHECK = """
import json, os, sys
from pathlib import Path
from src.syncbn import extension
extension.load_extension()
info = extension.last_build_info()
root = Path(extension.extensions_dir())
print(json.dumps({"info": info, "dir": str(root), "uid": os.getuid(),
                  "objects": [str(p) for p in root.rglob("*.o")]}))
"""


def test_kernels_come_from_the_build_not_compiled_at_run_time(built_image: BuiltImage) -> None:
    proc = built_image.run(["python3", "-c", _KERNEL_CHECK])
    assert proc.returncode == 0, _tail(proc)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    info = report["info"]
    assert info.get("compiled") is False, f"the kernels were compiled at run time: {info}"
    assert str(info.get("build_dir", "")).startswith(EXTENSIONS_DIR + "/"), info
    assert report["dir"] == EXTENSIONS_DIR
    assert report["uid"] == HOST_UID != 0, "the container must run as the build-time user, not root"
    assert report["objects"] == [], "object files of the build were left in the image"


def _image_files(built_image: BuiltImage) -> tuple[str, Path]:
    """A container of the image and its file system, mounted on the host (root reads everything)."""
    container = built_image.storage.run("from", "--pull=never", built_image.tag).stdout.strip()
    root = Path(built_image.storage.run("mount", container).stdout.strip())
    return container, root


# Paths (relative to the image root) that are build leftovers or secrets if present.
_FORBIDDEN_GLOBS = [
    "root/.cache/pip", "home/*/.cache/pip", "root/.cache/pip/**", "tmp/*",
    "var/cache/apt/archives/*.deb", "var/cache/apt/*.bin",
    f"{APP_DIR.lstrip('/')}/.git", f"{APP_DIR.lstrip('/')}/.venv", f"{APP_DIR.lstrip('/')}/outputs",
    f"{APP_DIR.lstrip('/')}/build/torch_extensions/*/*.o",
    "root/.netrc", "home/*/.netrc", "root/.git-credentials", "home/*/.git-credentials",
    "root/.pypirc", "home/*/.pypirc", "root/.docker/config.json", "home/*/.docker/config.json",
    "root/.ssh/id_*", "home/*/.ssh/id_*", "root/.config/pip", "etc/pip.conf",
]


def test_image_has_no_build_caches_or_credentials(built_image: BuiltImage) -> None:
    container, root = _image_files(built_image)
    try:
        found = sorted(str(p.relative_to(root)) for pattern in _FORBIDDEN_GLOBS for p in root.glob(pattern))
        lists = root / "var" / "lib" / "apt" / "lists"
        apt_lists = [p.name for p in lists.iterdir() if p.is_file() and p.name != "lock"] if lists.exists() else []
        app = root / APP_DIR.lstrip("/")
        pycache = [str(p.relative_to(root)) for p in app.rglob("__pycache__")]
        # No tool of ours writes these; a token in the environment would ship in the image config.
        env = " ".join(built_image.config.get("Env") or [])
    finally:
        built_image.storage.run("rm", container, check=False)
    assert not found, f"build leftovers or credentials in the image: {found}"
    assert not apt_lists, f"apt package lists left in the image: {apt_lists[:5]}"
    assert not pycache, f"bytecode caches copied from the build context: {pycache[:5]}"
    for secret in ("TOKEN", "PASSWORD", "SECRET", "API_KEY"):
        assert secret not in env.upper(), f"{secret} in the image environment: {env}"


def test_image_size_and_build_times_are_recorded(built_image: BuiltImage, capsys: pytest.CaptureFixture) -> None:
    # buildah 1.28 reports sizes only human-readable ("6.48 GB", decimal units).
    listing = json.loads(built_image.storage.run("images", "--json", built_image.tag).stdout)
    size = _bytes(str(listing[0]["size"]))
    report = {"image_bytes": size, "base_seconds": round(built_image.base_seconds, 1),
              "build_seconds": round(built_image.build_seconds, 1),
              "driver": built_image.storage.driver, "cpu": _cpu_model(), "cores": os.cpu_count()}
    (built_image.log_dir / "report.json").write_text(json.dumps(report, indent=1))
    with capsys.disabled():
        print(f"\ndocker image report: {json.dumps(report)}")
    assert 0 < size < MAX_IMAGE_BYTES, report


def _bytes(human: str) -> int:
    """Bytes of a size as buildah prints it: "6.48 GB", "512 MB", "1234" (decimal units)."""
    number, _, unit = human.strip().partition(" ")
    scale = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit.upper()]
    return int(float(number) * scale)


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"
