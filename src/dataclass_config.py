"""to_dataclass: one config group as its dataclass, from a dataclass, a mapping or an OmegaConf node.

Builders accept any of the three (tests and scripts pass dicts, the trainer passes Hydra's nodes), and
an unknown key is an error naming it, as Hydra's structured configs would say.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterable, Mapping, TypeVar

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


# --- config groups extended by their owners ---------------------------------------------------------------------
# A config group (data, model, trainer, predict.py's keys) is a core dataclass plus the option dataclasses that
# its owners declare in their own files: a task (src/tasks/<task>/options.py), a dataset or a model family (their
# registration's `options=`). The keys stay where users write them (data.crop_size, model.output_stride, topk);
# adding one touches only the owner's files.

Owned = tuple[str, type]  # (owner, named in messages: a task, "data=<name>" or a model family; its dataclass)


def extend(base: type[T], parts: Iterable[Owned]) -> type[T]:
    """`base` with the fields of every part's dataclass added: a dataclass of the same name, subclassing `base`.

    A field that several owners declare is one key: they must give it the same type and default (ValueError
    naming both otherwise), and it is in use when any of them is.
    """
    base_fields = {f.name for f in dataclasses.fields(base)}  # type: ignore[arg-type]
    added: dict[str, tuple[str, Any, dataclasses.Field]] = {}
    for owner, schema in parts:
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            if f.name in base_fields:
                raise ValueError(f"{owner} declares the option {f.name!r}, which {base.__name__} already has")
            if f.name in added:
                first, kind, other = added[f.name]
                if kind != hints[f.name] or _default(other) != _default(f):
                    raise ValueError(f"{owner} and {first} both declare the option {f.name!r}, with different types "
                                     f"or defaults: give it one meaning, or another name")
                continue
            added[f.name] = (owner, hints[f.name], f)
    fields = [(name, kind, dataclasses.field(default=f.default, default_factory=f.default_factory))
              if f.default_factory is not dataclasses.MISSING else (name, kind, dataclasses.field(default=f.default))
              for name, (_, kind, f) in added.items()]
    extended = dataclasses.make_dataclass(base.__name__, fields, bases=(base,))
    extended.__module__, extended.__doc__ = base.__module__, base.__doc__
    return extended


def section(values: Any, schema: type[T]) -> T:
    """The `schema` dataclass's fields read from `values` (an extended group's instance that holds them)."""
    return schema(**{f.name: getattr(values, f.name) for f in dataclasses.fields(schema)})  # type: ignore[arg-type]


def foreign_settings(values: Any, parts: Iterable[Owned], active: set[str]) -> list[tuple[str, Any, list[str]]]:
    """(key, value, its owners) for every option of `values` set away from its default whose owners are none of
    the `active` ones (the run's task, dataset, model): a setting nothing in this run reads."""
    owners: dict[str, list[str]] = {}
    defaults: dict[str, Any] = {}
    for owner, schema in parts:
        for f in dataclasses.fields(schema):
            owners.setdefault(f.name, []).append(owner)
            defaults[f.name] = _default(f)
    return [(name, getattr(values, name), names) for name, names in owners.items()
            if not set(names) & active and getattr(values, name) != defaults[name]]


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
