"""to_dataclass: one config group as its dataclass, from a dataclass, a mapping or an OmegaConf node.

Builders accept any of the three (tests and scripts pass dicts, the trainer passes Hydra's nodes), and
an unknown key is an error naming it, as Hydra's structured configs would say.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

from omegaconf import DictConfig, OmegaConf

T = TypeVar("T")


def to_dataclass(cfg: Any, schema: type[T], group: str) -> T:
    """`cfg` as an instance of the dataclass `schema`; `group` (e.g. "data") names the keys in errors."""
    if isinstance(cfg, schema):
        return cfg
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(cfg, Mapping):
        raise TypeError(f"expected a {schema.__name__}, a dict or a DictConfig, got {type(cfg).__name__}")
    known = {f.name for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"unknown {group} config key(s) {unknown} ({', '.join(f'{group}.{k}' for k in unknown)}); "
                         f"known keys: {sorted(known)}")
    return schema(**cfg)
