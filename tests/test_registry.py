"""src.registry: registration, lookup by task, and the errors that name the config key."""
from __future__ import annotations

import pytest

from src.registry import Registry


def test_register_get_and_names_by_task() -> None:
    reg = Registry("model.name")

    @reg.register("a", task="classification", family="x")
    def build_a() -> str:
        return "a"

    reg.register("b", task="segmentation")(lambda: "b")
    assert reg.get("a").builder is build_a and reg.get("a").info == {"family": "x"}
    assert reg.get("b").builder() == "b" and reg.get("b").task == "segmentation"
    assert reg.names() == ("a", "b") and reg.names("segmentation") == ("b",)
    assert "a" in reg and "c" not in reg and [e.name for e in reg] == ["a", "b"]


def test_unknown_name_lists_the_valid_ones() -> None:
    reg = Registry("data.name")
    reg.register("shapes", task="classification")(lambda: None)
    with pytest.raises(ValueError, match=r"data.name must be one of shapes; got 'nope'"):
        reg.get("nope")


def test_duplicate_and_bad_task_are_errors() -> None:
    reg = Registry("data.name")
    reg.register("shapes", task="classification")(lambda: None)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("shapes", task="classification")(lambda: None)
    with pytest.raises(ValueError, match="task must be a task's name"):
        reg.register("x", task="not a name")
    with pytest.raises(ValueError, match="task must be a task's name"):
        reg.register("x", task=("detection", "not a name"))


def test_an_entry_can_serve_several_tasks() -> None:
    reg = Registry("data.name")
    reg.register("boxes", task="detection")(lambda: None)
    reg.register("both", task=("detection", "instance_segmentation"))(lambda: None)
    assert reg.get("both").task == "detection" and reg.get("both").tasks == ("detection", "instance_segmentation")
    assert reg.get("boxes").tasks == ("detection",)
    assert reg.names("detection") == ("boxes", "both") and reg.names("instance_segmentation") == ("both",)
