"""src/commands/continue_command.py: the command a Ctrl-C'd run prints is the user's own launcher, with only
trainer.resume=<run folder>: python, torchrun with its options, `make train NPROC=N`."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from src.commands import continue_command as module
from src.commands.continue_command import continue_command

TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "abc", "LOCAL_WORLD_SIZE": "2"}


@pytest.fixture
def in_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a run folder below it; train.py as the script; no launcher around."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py", "data.batch_size=8", "hydra.run.dir=outputs/x"])
    for key in (*TORCHRUN_ENV, module.MAKE_TARGET_ENV):
        monkeypatch.delenv(key, raising=False)
    return tmp_path / "outputs" / "x"


def test_python(in_repo: Path) -> None:
    command = continue_command(in_repo)
    assert command.split()[1:] == ["train.py", "trainer.resume=outputs/x"]
    assert command.split()[0] in ("python", sys.executable)
    assert continue_command(Path("/elsewhere/run")).endswith(" train.py trainer.resume=/elsewhere/run")


@pytest.mark.parametrize("agent, launcher", [
    (["/v/bin/python", "/v/bin/torchrun", "--standalone", "--nproc_per_node=2", "train.py", "seed=1"],
     ["--standalone", "--nproc_per_node=2"]),
    (["/usr/bin/python3", "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2", "train.py"],
     ["-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2"]),
])
def test_torchrun_with_its_own_options(in_repo: Path, monkeypatch: pytest.MonkeyPatch, agent: list[str],
                                       launcher: list[str]) -> None:
    for key, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(module, "_parent_argv", lambda: agent)
    words = continue_command(in_repo).split()
    assert words[-2:] == ["train.py", "trainer.resume=outputs/x"] and words[-2 - len(launcher):-2] == launcher
    assert words[0].endswith("torchrun") or words[0] in ("python", sys.executable)


def test_make_train(in_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {**TORCHRUN_ENV, "MAKELEVEL": "1"}.items():  # torchrun under another make target (make test)
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(module, "_parent_argv", lambda: None)
    assert not continue_command(in_repo).startswith("make")
    monkeypatch.setenv(module.MAKE_TARGET_ENV, "train")  # the Makefile's train recipe
    assert continue_command(in_repo) == 'make train NPROC=2 ARGS="trainer.resume=outputs/x"'
