"""Suite-wide pytest wiring: `cuda` tests run only where a GPU is present; test files are the units that
pytest-xdist's workers share out (`make test` runs the suite on several workers); the trained runs that several
test modules read (made once per session, also across workers: tests/support/trained_runs.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.trained_runs import trained_cls_run  # noqa: F401  (session fixtures)

TESTS = Path(__file__).resolve().parent
# Folders whose files share session fixtures that take minutes (the docker image, the reference torchrun
# run and the SLURM cluster): all their tests go to one worker, so those fixtures are made once.
SHARED_FIXTURE_FOLDERS = ("docker", "cluster")
# The longest groups start first, so no worker is left with a long one at the end of the run.
# (A clean clone, as in CI, compiles every kernel variant: the nvcc check and the faulty self-check build too.)
LONG_GROUPS_FIRST = ("docker", "cluster", "engine/test_compile.py", "syncbn/test_compile.py",
                     "syncbn/test_cuda_build.py", "syncbn/test_selfcheck.py", "commands/", "test_docs.py",
                     "test_new_project.py")


@pytest.fixture(autouse=True)
def _backend_flags_settable() -> None:
    """torch.testing._internal (imported by torch.library.opcheck and by PyTorch's module_db) calls
    torch.backends.disable_global_flags() at import, for the rest of the process: every later in-process training
    run on that pytest worker would then fail setting torch.backends.cudnn.benchmark. Undo it before each test."""
    if torch.backends.flags_frozen():  # the flag is a global of torch.backends' own namespace
        torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True


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
