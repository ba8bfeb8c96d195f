"""tests/docker/shared_once.py: a shared fixture's work is done once per test run, also across xdist workers."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.docker.shared_once import shared_results


class _Worker:
    """A worker's tmp_path_factory as shared_results uses it: its base temp folder inside the run's folder."""

    def __init__(self, run_folder: Path, name: str) -> None:
        self.base = run_folder / name

    def getbasetemp(self) -> Path:
        return self.base


def test_xdist_workers_share_one_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def make(folder: Path) -> None:
        calls.append(folder)
        (folder / "result").write_text("made")

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = shared_results(_Worker(tmp_path, "popen-gw0"), "expensive", make)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = shared_results(_Worker(tmp_path, "popen-gw1"), "expensive", make)
    assert first == second == tmp_path / "expensive"
    assert calls == [first] and (first / "result").read_text() == "made"


def test_without_xdist_each_session_makes_its_own(tmp_path_factory: pytest.TempPathFactory,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    calls: list[Path] = []
    folder = shared_results(tmp_path_factory, "expensive", calls.append)
    assert calls == [folder] and folder.parent == tmp_path_factory.getbasetemp()
