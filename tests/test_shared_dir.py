"""tests/support/shared_dir.py: a shared folder is made once per session, a failed attempt is made afresh, and a
changed shared folder is named."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.shared_dir import assert_unchanged, fingerprint, made_once, session_root


class _Factory:
    """What made_once uses of pytest's TempPathFactory: getbasetemp()."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def getbasetemp(self) -> Path:
        return self.base


@pytest.fixture(autouse=True)
def _outside_xdist(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests give made_once their own base folder; under xdist it would take the workers' shared parent."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


def test_the_folder_is_made_by_the_first_caller_only(tmp_path: Path) -> None:
    calls: list[Path] = []

    def make(folder: Path) -> None:
        calls.append(folder)
        (folder / "out.txt").write_text("made")

    factory = _Factory(tmp_path)
    first = made_once(factory, "run", make)
    assert made_once(factory, "run", make) == first and calls == [first]
    assert sorted(p.name for p in first.iterdir()) == ["out.txt"]  # the completion mark lies beside it


def test_a_failed_make_is_made_afresh_by_the_next_caller(tmp_path: Path) -> None:
    def broken(folder: Path) -> None:
        (folder / "half.txt").write_text("")
        raise RuntimeError("training failed")

    factory = _Factory(tmp_path)
    with pytest.raises(RuntimeError, match="training failed"):
        made_once(factory, "run", broken)
    folder = made_once(factory, "run", lambda f: (f / "whole.txt").write_text(""))
    assert sorted(p.name for p in folder.iterdir()) == ["whole.txt"]


def test_xdist_workers_share_the_folder_above_their_own_basetemp(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert session_root(_Factory(tmp_path / "gw0")) == tmp_path / "gw0"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert session_root(_Factory(tmp_path / "gw0")) == session_root(_Factory(tmp_path / "gw1")) == tmp_path


def test_two_xdist_workers_share_one_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def make(folder: Path) -> None:
        calls.append(folder)
        (folder / "result").write_text("made")

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = made_once(_Factory(tmp_path / "popen-gw0"), "expensive", make)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = made_once(_Factory(tmp_path / "popen-gw1"), "expensive", make)
    assert first == second == tmp_path / "shared" / "expensive"
    assert calls == [first] and (first / "result").read_text() == "made"


def test_a_changed_shared_folder_is_named(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    before = fingerprint(tmp_path)
    assert_unchanged(tmp_path, before)
    (tmp_path / "metrics.jsonl").write_text("{}\n{}\n")
    (tmp_path / "extra.json").write_text("")
    with pytest.raises(AssertionError, match=r"\['extra.json', 'metrics.jsonl'\]"):
        assert_unchanged(tmp_path, before)
