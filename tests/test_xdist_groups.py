"""make test's workers get whole groups (tests/conftest.py): the group must reach pytest-xdist's scheduler."""
from __future__ import annotations

import os

import pytest

from tests.conftest import xdist_group


def test_the_group_reaches_the_scheduler(request: pytest.FixtureRequest) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("not under pytest-xdist's --dist loadgroup (make test and make test-fast use it)")
    # loadgroup passes the group to its scheduler as the node id's @suffix; without it the tests of a file or
    # folder are spread over the workers, and each worker makes the minutes-long shared fixtures again.
    assert request.node.nodeid.endswith("@" + xdist_group(request.node)), request.node.nodeid
