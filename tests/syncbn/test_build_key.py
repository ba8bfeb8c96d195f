"""The extension's cache key: every input that can change the built library changes the variant's name, and
with it the folder the loader looks in, so a warm cache can never pass a build that a clean clone would fail.

Nothing is compiled: the key is computed on a copy of csrc/ with stand-in compiler, linker and nvcc scripts
(each answers `--version` with what the test writes into it), and a build is faked by its marker files.
"""
from __future__ import annotations

import shutil
import stat
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

from src.syncbn import extension


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


class _Tools:
    """A copy of csrc/, a compiler, two linkers and two CUDA toolkits, all stand-ins in `root`."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.monkeypatch = root, monkeypatch
        self.csrc = Path(shutil.copytree(extension.CSRC, root / "csrc"))
        monkeypatch.setattr(extension, "CSRC", self.csrc)
        monkeypatch.setenv("SYNCTRAIN_EXTENSIONS_DIR", str(root / "cache"))
        self.ld = _script(root / "ld", "echo 'GNU ld 2.40'\n")
        self.other_ld = _script(root / "ld.gold", "echo 'GNU gold 1.16'\n")
        self.compiler(version="g++ 12.2.0", linker=self.ld)
        monkeypatch.setenv("CXX", str(root / "cxx"))
        self.cuda = [self.toolkit(root / "cuda-a", "13.0"), self.toolkit(root / "cuda-b", "13.0")]
        monkeypatch.setenv("CUDA_HOME", str(self.cuda[0]))

    def compiler(self, version: str, linker: Path, name: str = "cxx") -> Path:
        answers = f'case "$1" in -print-prog-name=ld) echo {linker};; *) echo "{version}";; esac\n'
        return _script(self.root / name, answers)

    def toolkit(self, root: Path, release: str) -> Path:
        (root / "include").mkdir(parents=True, exist_ok=True)
        (root / "include" / "cuda_runtime.h").touch()
        (root / "bin").mkdir(exist_ok=True)
        _script(root / "bin" / "nvcc", f"echo 'Cuda compilation tools, release {release}, V{release}.88'\n")
        return root

    def edit(self, relative: str) -> None:
        path = self.csrc / relative
        path.write_text(path.read_text() + "\n// an edit\n")


CHANGES: dict[str, Callable[[_Tools], None]] = {
    "a source": lambda t: t.edit("cpu/" + sorted(p.name for p in (t.csrc / "cpu").glob("*.cpp"))[0]),
    "a header": lambda t: t.edit("ops.h"),
    "a compile flag": lambda t: t.monkeypatch.setattr(extension, "_BASE_CFLAGS", [*extension._BASE_CFLAGS, "-g"]),
    "a link flag": lambda t: t.monkeypatch.setattr(extension, "_LDFLAGS", [*extension._LDFLAGS, "-Wl,--as-needed"]),
    "the build code": lambda t: t.monkeypatch.setattr(extension, "__file__", str(_script(
        t.root / "extension.py", Path(extension.__file__).read_text() + "\n# an edit\n"))),
    "the compiler's path": lambda t: t.monkeypatch.setenv("CXX", str(t.compiler("g++ 12.2.0", t.ld, "cxx2"))),
    "the compiler's version": lambda t: t.compiler(version="g++ 13.3.0-1", linker=t.ld),
    "the linker's path": lambda t: t.compiler(version="g++ 12.2.0", linker=t.other_ld),
    "the linker's version": lambda t: _script(t.ld, "echo 'GNU ld 2.41.50'\n"),
    "PyTorch": lambda t: t.monkeypatch.setattr(torch, "__version__", torch.__version__ + "+local"),
    "Python": lambda t: t.monkeypatch.setattr(sys, "version", sys.version + " patched"),
}
CUDA_CHANGES: dict[str, Callable[[_Tools], None]] = {
    "the CUDA toolkit's path": lambda t: t.monkeypatch.setenv("CUDA_HOME", str(t.cuda[1])),
    "the CUDA toolkit's version": lambda t: t.toolkit(t.cuda[0], "13.1"),
    "a CUDA source": lambda t: t.edit("cuda/" + sorted(p.name for p in (t.csrc / "cuda").glob("*.cu"))[0]),
}


def _fake_build(spec: extension.BuildSpec) -> None:
    spec.build_dir.mkdir(parents=True)
    spec.library.touch()
    spec.ok_marker.touch()


@pytest.mark.parametrize("change", [*CHANGES, *CUDA_CHANGES])
def test_each_input_of_the_build_changes_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    tools = _Tools(tmp_path, monkeypatch)
    with_cuda = change in CUDA_CHANGES
    if with_cuda and torch.version.cuda is None:
        pytest.skip("a CPU-only torch: its CUDA variant needs no toolkit")
    before = extension.make_spec(with_cuda=with_cuda)
    _fake_build(before)
    assert extension.make_spec(with_cuda=with_cuda) == before  # nothing changed: the build is found again
    (CUDA_CHANGES if with_cuda else CHANGES)[change](tools)
    after = extension.make_spec(with_cuda=with_cuda)
    assert after.name != before.name, f"changing {change} keeps the key {before.name}: a stale build is reused"
    assert not extension._is_built(after)  # the loader builds it anew
