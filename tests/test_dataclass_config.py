"""Config groups extended by their owners (src/dataclass_config.py): the options a task, a dataset or a model
family declares join the group's schema under their own names, one key when two owners share it, refused when
two owners give it different meanings; a setting no owner of the run reads is found."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import pytest
from omegaconf import OmegaConf

from src.dataclass_config import extend, foreign_settings, section


@dataclass
class Core:
    name: str = "a"


@dataclass
class Crops:
    crop_size: int = 64
    scales: list[float] = field(default_factory=lambda: [0.5, 2.0])


@dataclass
class Boxes:
    crop_size: int = 64  # the same key as Crops': one option, read by both owners
    score: Optional[float] = None


def test_options_join_the_group_and_shared_keys_are_one() -> None:
    schema = extend(Core, [("seg", Crops), ("det", Boxes)])
    assert schema.__name__ == "Core" and issubclass(schema, Core)
    assert [f.name for f in dataclasses.fields(schema)] == ["name", "crop_size", "scales", "score"]
    values = schema(crop_size=32)
    assert section(values, Crops) == Crops(crop_size=32) and section(values, Boxes) == Boxes(crop_size=32)
    assert values.scales == [0.5, 2.0] and values.scales is not schema().scales  # a fresh default each time
    # The extended dataclass is a structured config Hydra checks keys and types against.
    merged = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), {"score": 0.5}))
    assert isinstance(merged, schema) and merged.score == 0.5
    with pytest.raises(Exception, match="crop_sz"):
        OmegaConf.merge(OmegaConf.structured(schema), {"crop_sz": 3})


def test_two_meanings_of_one_key_or_a_core_key_are_refused() -> None:
    @dataclass
    class OtherCrops:
        crop_size: int = 32

    with pytest.raises(ValueError, match="seg and det both declare the option 'crop_size', with different types or "
                                         "defaults"):
        extend(Core, [("det", OtherCrops), ("seg", Crops)])

    @dataclass
    class Renamed:
        name: str = "b"

    with pytest.raises(ValueError, match="x declares the option 'name', which Core already has"):
        extend(Core, [("x", Renamed)])


def test_settings_no_active_owner_reads_are_found() -> None:
    parts = [("seg", Crops), ("det", Boxes)]
    values = extend(Core, parts)(crop_size=32, score=0.3)
    assert foreign_settings(values, parts, {"seg", "det"}) == []
    assert foreign_settings(values, parts, {"seg"}) == [("score", 0.3, ["det"])]
    assert foreign_settings(values, parts, {"cls"}) == [("crop_size", 32, ["seg", "det"]), ("score", 0.3, ["det"])]
    assert foreign_settings(extend(Core, parts)(), parts, {"cls"}) == []  # defaults are nobody's settings
