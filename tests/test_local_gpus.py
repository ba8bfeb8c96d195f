"""More processes than visible GPUs on a node is refused before any process group (src/local_gpus.py), in
select_device and at config validation; the GPU count is monkeypatched, so no GPU is needed."""
from __future__ import annotations

import pytest
import torch

from src import process_group
from src.config import validate_config
from src.errors import UserError
from src.local_gpus import check_processes_fit_gpus


@pytest.fixture
def two_gpus(monkeypatch):
    """A node that seems to have 2 visible GPUs; set_device must never be reached when the check refuses."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    def no_set_device(device):
        raise AssertionError(f"set_device({device}) reached: the check must refuse first")

    monkeypatch.setattr(torch.cuda, "set_device", no_set_device)


def test_message_names_both_numbers_and_the_ways_out(two_gpus):
    with pytest.raises(UserError) as info:
        check_processes_fit_gpus("cuda", local_world_size=4)
    msg = str(info.value)
    for part in ("4 processes", "LOCAL_WORLD_SIZE=4", "only 2 GPUs", "device_count()=2", "--nproc_per_node=2",
                 "CUDA_VISIBLE_DEVICES", "device=cpu"):
        assert part in msg, (part, msg)


@pytest.mark.parametrize("device,procs,gpus", [("cuda", 2, 2), ("cuda", 1, 8), ("auto", 2, 2), ("cpu", 8, 1),
                                               ("cuda:0", 4, 2)])
def test_allowed_launches(two_gpus, device, procs, gpus):
    """As many processes as GPUs or fewer; the CPU; an explicit cuda:N (the user's own choice)."""
    check_processes_fit_gpus(device, local_world_size=procs, device_count=gpus)


def test_select_device_refuses_before_set_device(two_gpus, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "2")
    for device in ("cuda", "auto"):
        with pytest.raises(UserError, match="3 processes .* only 2 GPUs"):
            process_group.select_device(device)


def test_auto_without_cuda_is_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    check_processes_fit_gpus("auto")
    assert process_group.select_device("auto") == torch.device("cpu")


def test_config_validation_refuses(two_gpus, monkeypatch):
    """Training validation (world_size given) refuses with a UserError, before any process group."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(UserError, match="4 processes .* only 2 GPUs"):
        validate_config({"device": "cuda"}, world_size=4)
    with pytest.raises(ValueError, match="only 2 GPUs"):
        validate_config({"device": "auto"}, world_size=4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    validate_config({"device": "cpu"}, world_size=4)
