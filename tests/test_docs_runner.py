"""tests/docs_runner.py and tests/docs_worker.py on deliberately broken scripts: what a user's process would do
wrong must fail the command, whatever output the test expects of it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.docs_runner import CommandDidNotFinish, DocsRunner

TIMEOUT_S = 20  # the broken scripts below take milliseconds when they do finish


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsRunner]:
    docs_runner = DocsRunner({**os.environ, "OMP_NUM_THREADS": "1"}, tmp_path_factory.mktemp("runner_logs"))
    yield docs_runner
    docs_runner.close()


def _run(runner: DocsRunner, tmp_path: Path, body: str, name: str = "script.py") -> tuple[int, str]:
    script = tmp_path / name
    script.write_text(body)
    result = runner.run(str(script), [], tmp_path, TIMEOUT_S)
    return result.returncode, result.output


def test_a_command_that_hangs_after_printing_the_expected_error_fails(runner: DocsRunner, tmp_path: Path) -> None:
    body = "import time\nprint('data.root=/data/imagenet: no such folder', flush=True)\ntime.sleep(600)\n"
    with pytest.raises(CommandDidNotFinish, match=f"did not exit within {TIMEOUT_S} s") as error:
        _run(runner, tmp_path, body)
    assert "no such folder" in str(error.value)  # what it printed is shown, but cannot make it pass


def test_a_killed_command_fails(runner: DocsRunner, tmp_path: Path) -> None:
    body = ("import os, signal\nprint('data.root=/data/imagenet: no such folder', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(CommandDidNotFinish, match="was killed by SIGKILL"):
        _run(runner, tmp_path, body)


def test_the_exit_status_is_the_interpreters_after_its_shutdown(runner: DocsRunner, tmp_path: Path) -> None:
    assert _run(runner, tmp_path, "print('fine')\n") == (0, "fine\n")
    assert _run(runner, tmp_path, "raise SystemExit(4)\n")[0] == 4
    # The script's own code succeeds; its process does not (an exit handler fails it).
    assert _run(runner, tmp_path, "import atexit, os\natexit.register(os._exit, 3)\nprint('done')\n")[0] == 3


def test_a_command_whose_shutdown_hangs_fails(runner: DocsRunner, tmp_path: Path) -> None:
    # A thread nobody ends: the script's code returns, the interpreter waits for the thread at exit for ever.
    body = ("import threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()\n"
            "print('done', flush=True)\n")
    with pytest.raises(CommandDidNotFinish, match="did not exit within"):
        _run(runner, tmp_path, body)


def test_a_command_that_leaves_a_process_running_fails(runner: DocsRunner, tmp_path: Path) -> None:
    body = "import subprocess\nsubprocess.Popen(['sleep', '600'])\nprint('done')\n"
    with pytest.raises(CommandDidNotFinish, match=r"leaving 1 process\(es\) of its own running .*sleep 600"):
        _run(runner, tmp_path, body)


def test_each_command_imports_what_it_uses(runner: DocsRunner, tmp_path: Path) -> None:
    # Nothing of the project is loaded before a command, and nothing one command imported is there for the next.
    assert _run(runner, tmp_path, "import src.commands.train\n", "first.py")[0] == 0
    rc, output = _run(runner, tmp_path, "import src\nprint(src.commands.train.run)\n", "second.py")
    assert rc == 1 and "has no attribute 'commands'" in output, output
    assert _run(runner, tmp_path, "import sys\nsys.exit(any(m.startswith('src') for m in sys.modules))\n")[0] == 0


_EXITS_BADLY = """import json, sys, time
print(json.dumps({"ready": 1}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    open(request["log"], "w").write("ran")
    print(json.dumps({"rc": 0}), flush=True)
%s
"""


@pytest.mark.parametrize("end,message", [("sys.exit(3)", "exited with status 3"),
                                         ("time.sleep(600)", "did not exit within 5 s")])
def test_a_worker_that_does_not_exit_cleanly_fails_the_last_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    end: str, message: str) -> None:
    monkeypatch.setattr("tests.docs_runner.CLOSE_TIMEOUT_S", 5)
    worker = tmp_path / "worker.py"
    worker.write_text(_EXITS_BADLY % end)
    broken = DocsRunner(dict(os.environ), tmp_path, worker=worker)
    assert broken.run("train.py", ["trainer.dry_run=true"], tmp_path, TIMEOUT_S).returncode == 0
    with pytest.raises(CommandDidNotFinish, match=f"{message} after the last command, python train.py "
                                                  "trainer.dry_run=true"):
        broken.close()
