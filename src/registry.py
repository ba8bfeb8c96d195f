"""Name -> builder registries: what `data.name` and `model.name` can be, in one place each.

Adding a dataset or a model is one decorated function in the module that builds it; config validation,
the task checks and the error messages all read the registry, so there are no name lists to keep in step.

    DATASETS = Registry("data.name", requires="task")

    @DATASETS.register("shapes", task="classification")
    def build_shapes(cfg): ...

    DATASETS.get("shapes").builder(...)

A dataset names the tasks its files serve (`task=("detection", "instance_segmentation")`, a COCO-format dataset
whose files hold both boxes and masks: `task` is then its first, `tasks` all of them). A model names its family
instead (`MODELS = Registry("model.name", requires="family")`, src/models/registry.py), whose outputs decide the
tasks it serves; its entry's `tasks` is empty.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

Builder = TypeVar("Builder", bound=Callable[..., Any])


@dataclass(frozen=True)
class Entry:
    """One registered name: its builder, its task(s) and whatever else its family needs to say about it."""

    name: str
    builder: Callable[..., Any]
    tasks: tuple[str, ...]  # every task it serves as registered (task=): one or several; none for a model
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def task(self) -> str:
        """Its task (the first, for an entry of several)."""
        if not self.tasks:
            raise ValueError(f"{self.name!r} was registered without task= (a model's tasks are its family's)")
        return self.tasks[0]


class Registry:
    """Names a config key may take, each with a builder; `get` fails with the list of valid names."""

    def __init__(self, key: str, *, requires: str = "task") -> None:
        self.key = key  # the config key whose values name entries ("data.name"), for messages
        self.requires = requires  # the keyword every registration must give: "task", or an info key ("family")
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, *, task: str | tuple[str, ...] = (), **info: Any) -> Callable[[Builder], Builder]:
        """Decorator: register `builder` under `name` for `task`, the name of a task registered in src/tasks/
        (checked by config validation, which runs after every task has registered), or a tuple of several;
        `info` is what the entry's family or readers need (e.g. family=, options=)."""
        tasks = task if isinstance(task, tuple) else (task,)
        if self.requires != "task" and (info.get(self.requires) is None or tasks):
            raise ValueError(f"{self.key}={name!r} is registered with {self.requires}= (which decides its tasks), "
                             f"not task=")
        if self.requires == "task" and not tasks:
            raise ValueError(f"{self.key}={name!r}: task must be a task's name, e.g. 'classification', or a tuple "
                             "of them, got none")
        for one in tasks:
            if not isinstance(one, str) or not one.isidentifier():
                raise ValueError(f"{self.key}={name!r}: task must be a task's name, e.g. 'classification', or a "
                                 f"tuple of them, got {task!r}")

        def add(builder: Builder) -> Builder:
            if name in self._entries:
                raise ValueError(f"{self.key}={name!r} is registered twice "
                                 f"({self._entries[name].builder.__module__} and {builder.__module__})")
            self._entries[name] = Entry(name, builder, tuple(tasks), dict(info))
            return builder

        return add

    def get(self, name: str) -> Entry:
        """The entry for `name`; ValueError naming the key and every registered name otherwise."""
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"{self.key} must be one of {', '.join(self.names())}; got {name!r}") from None

    def names(self, task: str | None = None) -> tuple[str, ...]:
        """Registered names in registration order, optionally only those serving one task."""
        return tuple(n for n, e in self._entries.items() if task is None or task in e.tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries.values())
