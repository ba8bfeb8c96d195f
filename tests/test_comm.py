"""src/comm.py on real gloo process groups over loopback (never mocks)."""
from __future__ import annotations

import datetime
import socket
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from src import comm
from src.errors import UserError
from tests.support.gloo import run_on_ranks

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_case(rank: int, world: int, case: str, tmp: str) -> object:
    """One case on this rank; an exception comes back as its traceback text (the tests assert on it)."""
    try:
        return CASES[case](rank, world, Path(tmp))
    except BaseException:
        return "EXC " + traceback.format_exc()


def _case_gather(rank: int, world: int, tmp: Path) -> object:
    local = torch.full((rank + 1, 2), float(rank))
    gathered = comm.all_gather_tensor(local)
    summed = comm.reduce_dict({"a": float(rank), "b": 1.0}, average=False)
    meaned = comm.reduce_dict({"a": float(rank)}, average=True)
    objs = comm.all_gather_object({"rank": rank})
    return {
        "shapes": [tuple(t.shape) for t in gathered],
        "values": [t.unique().tolist() for t in gathered],
        "sum": summed, "mean": meaned, "objs": objs,
        "bcast": comm.broadcast_object(f"from {rank}"),
    }


def _case_zero_first_ok(rank: int, world: int, tmp: Path) -> object:
    marker = tmp / "downloaded"
    with comm.zero_first():
        if comm.get_local_rank() == 0:
            marker.write_text("data")
        seen = marker.exists()  # others enter only after the leader finished
    return seen


def _case_zero_first_fail(rank: int, world: int, tmp: Path) -> object:
    with comm.zero_first():
        if comm.get_local_rank() == 0:
            raise OSError("network unreachable")
    return "entered"


def _case_zero_first_user_error(rank: int, world: int, tmp: Path) -> object:
    try:
        with comm.zero_first():
            if comm.get_local_rank() == 0:
                raise UserError("data.download=true: no network")
    except UserError as err:
        return f"UserError {err}"
    return "entered"


CASES = {"gather": _case_gather, "zero_first_ok": _case_zero_first_ok, "zero_first_fail": _case_zero_first_fail,
         "zero_first_user_error": _case_zero_first_user_error}


def _run(case: str, world: int, tmp_path: Path) -> dict[int, object]:
    return dict(enumerate(run_on_ranks(world, _rank_case, case, str(tmp_path))))


def test_single_process_helpers_are_identities() -> None:
    assert not comm.is_initialized()
    assert comm.get_world_size() == 1 and comm.get_rank() == 0 and comm.is_main_process()
    t = torch.arange(3.0)
    assert comm.all_gather_tensor(t)[0] is t
    assert comm.all_reduce(t.clone(), "mean").tolist() == [0.0, 1.0, 2.0]
    assert comm.reduce_dict({"x": 2.0}) == {"x": 2.0}
    comm.barrier()
    with comm.zero_first():
        pass
    # No process group, no collective timeouts: such text comes from elsewhere and is not reworded.
    assert not comm.is_timeout(RuntimeError("Timed out waiting 20000ms for recv operation to complete"))


def test_gather_reduce_broadcast_with_uneven_tensors(tmp_path: Path) -> None:
    results = _run("gather", 3, tmp_path)
    for rank, res in results.items():
        assert not isinstance(res, str), res
        assert res["shapes"] == [(1, 2), (2, 2), (3, 2)]
        assert res["values"] == [[0.0], [1.0], [2.0]]
        assert res["sum"] == {"a": 3.0, "b": 3.0}
        assert res["mean"] == {"a": 1.0}
        assert res["objs"] == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
        assert res["bcast"] == "from 0"


def test_zero_first_lets_the_leader_finish_first(tmp_path: Path) -> None:
    results = _run("zero_first_ok", 3, tmp_path)
    assert results == {0: True, 1: True, 2: True}


def test_zero_first_failure_is_an_error_on_every_rank(tmp_path: Path) -> None:
    results = _run("zero_first_fail", 3, tmp_path)
    assert "OSError: network unreachable" in results[0]
    for rank in (1, 2):
        assert results[rank].startswith("EXC "), results[rank]
        assert "local rank 0 of this node failed" in results[rank]
        assert "network unreachable" in results[rank]


def test_zero_first_passes_a_users_mistake_on_as_the_same_message(tmp_path: Path) -> None:
    """Every rank raises the leader's UserError with its exact text: printed once, not once per rank."""
    results = _run("zero_first_user_error", 3, tmp_path)
    assert results == {rank: "UserError data.download=true: no network" for rank in range(3)}


def test_unknown_reduce_op_is_rejected() -> None:
    # Only reachable with a group; check the message through a one-rank gloo group.
    port = _free_port()
    store = torch_dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=30))
    torch_dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="unknown reduce op 'avg'"):
            comm.all_reduce(torch.zeros(1), "avg")
    finally:
        torch_dist.destroy_process_group()
