"""Suite-wide pytest wiring: `cuda` tests run only where a GPU is present; test files are the units that
pytest-xdist's workers share out (`make test` runs the suite on several workers); the trained runs that several
test modules read (made once per session, also across workers: tests/support/trained_runs.py); a guard that
fails any test leaving process-wide state changed (tests/support/process_state.py); the gloo pools' workers
checked for a clean exit when the session ends (tests/support/gloo.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch

from src.commands.predict import register_predict_schema
from src.config import register_train_schema
from tests.support import gloo, process_state

from tests.support.trained_runs import trained_cls_run  # noqa: F401  (session fixtures)

TESTS = Path(__file__).resolve().parent
# conf/train.yaml and conf/predict.yaml compose onto these (the entry points' bodies store them when imported).
register_train_schema()
register_predict_schema()
# Folders whose files share session fixtures that take minutes (the docker image, the reference torchrun
# run and the SLURM cluster): all their tests go to one worker, so those fixtures are made once.
SHARED_FIXTURE_FOLDERS = ("docker", "cluster")
# The longest groups start first, so no worker is left with a long one at the end of the run.
# (A clean clone, as in CI, compiles every kernel variant: the nvcc check and the faulty self-check build too.)
LONG_GROUPS_FIRST = ("docker", "cluster", "engine/test_compile.py", "syncbn/test_compile.py",
                     "syncbn/test_cuda_build.py", "syncbn/test_selfcheck.py", "commands/", "test_docs.py",
                     "test_new_project.py")


def _guard(who: str) -> Iterator[None]:
    """Fail `who` when it leaves process-wide state changed (tests/support/process_state.py lists what is
    watched), naming what changed; then put it back, so that what runs after it runs as it would alone."""
    before = process_state.snapshot()
    yield
    changed = process_state.changes(before, process_state.snapshot())
    if changed:
        stuck = process_state.restore(before)
        pytest.fail(f"{who} left process-wide state changed (restore it: monkeypatch, process_state.restoring(...) "
                    "or the restores_process_state fixture):\n  " + "\n  ".join(changed)
                    + (f"\n  (cannot be put back in this process: {', '.join(stuck)})" if stuck else ""),
                    pytrace=False)


@pytest.fixture(autouse=True, scope="session")
def _gloo_workers_exit_cleanly() -> Iterator[None]:
    """At the session's end every gloo pool worker (tests/support/gloo.py) must exit with status 0; else the
    error names the workers and the tests that ran on them."""
    yield
    reports = gloo.close_all()
    if reports:
        pytest.fail("\n".join(reports), pytrace=False)


@pytest.fixture(autouse=True, scope="session")
def _session_state_guard() -> Iterator[None]:
    """Session-scoped fixtures and conftest imports: what they change must be undone by the session's end."""
    yield from _guard("the session's fixtures")


@pytest.fixture(autouse=True, scope="module")
def _module_state_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Module-scoped fixtures (and a module's import-time code run during its tests) restore what they change."""
    yield from _guard(f"{request.node.nodeid} (its module-scoped fixtures)")


@pytest.fixture(autouse=True)
def _process_state_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test, with its function-scoped fixtures, restores what it changes."""
    yield from _guard(request.node.nodeid)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The test runs torch on one thread (as the one-thread command runs it is compared with); put back after."""
    with process_state.restoring("torch intra-op threads"):
        torch.set_num_threads(1)
        yield


@pytest.fixture
def restores_rng() -> Iterator[None]:
    """For tests that seed torch's, numpy's or Python's global generator: their states are put back after."""
    with process_state.restoring(*process_state.GLOBAL_RNGS):
        yield


@pytest.fixture
def restores_backend_flags() -> Iterator[None]:
    """For tests that import torch.testing._internal (torch.library.opcheck, PyTorch's module_db): the import
    freezes torch.backends' flags for the rest of the process (tests/support/process_state.py)."""
    with process_state.restoring(*process_state.BACKEND_FLAGS):
        yield


@pytest.fixture
def restores_process_state() -> Iterator[None]:
    """For tests that change process-wide state on purpose (a command run in this process sets threads, seeds,
    logging and signal handlers as in its own process): everything process_state watches is put back."""
    with process_state.restoring():
        yield


def xdist_group(item: pytest.Item) -> str:
    """The unit of work `item` belongs to: its shared-fixture folder, else its file (module fixtures made once)."""
    relative = Path(str(item.path)).resolve().relative_to(TESTS)
    if relative.parts[0] in SHARED_FIXTURE_FOLDERS:
        return relative.parts[0]
    return relative.as_posix()


def _start_order(group: str) -> int:
    return next((i for i, prefix in enumerate(LONG_GROUPS_FIRST) if group.startswith(prefix)), len(LONG_GROUPS_FIRST))


# tryfirst: pytest-xdist reads the xdist_group marks in its own collection hook, which would otherwise run first.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked `cuda` on machines without a GPU; group tests for pytest-xdist's `--dist loadgroup`."""
    groups: dict[str, str] = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker is None:
            groups[item.nodeid] = xdist_group(item)
            item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
        else:
            groups[item.nodeid] = marker.kwargs.get("name") or marker.args[0]
    # A stable sort: the tests of one group keep their order (and stay together, for module fixtures).
    items.sort(key=lambda item: _start_order(groups[item.nodeid]))
    if torch.cuda.is_available():
        return
    reason = "needs a CUDA GPU (marked `cuda`)"
    # part: gpu-tools
    reason += "; run scripts/gpu_check.sh on one"
    # /part
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
