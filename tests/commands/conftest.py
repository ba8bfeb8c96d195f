"""What several command tests share: a runner of commands as users type them (tests/docs_runner.py)."""
from __future__ import annotations

import os
from typing import Iterator

import pytest

from tests.docs_runner import DocsRunner


@pytest.fixture(scope="session")
def user_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsRunner]:
    """`python SCRIPT ARGS` in processes forked from one that imported the libraries once (about a second each
    instead of an interpreter's start-up), in a user's environment: no HYDRA_FULL_ERROR (a mistake is one
    message), no torchrun variables, one thread, no downloads of weights."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                             "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    runner = DocsRunner(env, tmp_path_factory.mktemp("user_command_logs"))
    yield runner
    runner.close()
