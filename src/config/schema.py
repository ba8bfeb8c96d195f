"""The training config's schema: TrainConfig (the top level and its groups), and train_schema(), TrainConfig with
every owner's keys added to its groups (the tasks' Task.config_options, the datasets' and model families'
registrations), built when first needed, once the registries are loaded: importing this package imports no task.
register_train_schema() stores it in Hydra's ConfigStore as `train_schema` (train.py's body calls it)."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from src.config.sections import OptimConfig, SchedConfig, TrainerConfig
from src.config.tracker import TrackerConfig
from src.data.config import DataConfig, data_schema
from src.dataclass_config import Owned, extend
from src.models.config import ModelConfig, NormConfig, model_schema
from src.tasks import Task, all_tasks

DEVICES = ("auto", "cpu", "cuda")


def task_options(group: str) -> list[Owned]:
    """(task name, its option dataclass) of every registered task that adds keys to config group `group`."""
    return [(task.name, task.config_options[group]) for task in all_tasks() if group in task.config_options]


def data_config(**values: Any) -> DataConfig:
    """A `data` group config with every dataset's and task's options (for code and tests that build one)."""
    return _group_schemas()["data"](**values)


@dataclass
class TrainConfig:
    """Everything `train.py` reads; `hydra` is Hydra's own node and is not part of this schema. The groups here are
    their core keys; train_schema() is this with every owner's options added, the class validate_config returns."""

    seed: int = 0
    device: str = "auto"
    # The run's task (src/tasks/): null = the one that model.name and data.name have in common; a task's name
    # chooses where they share several. validate_config sets it to the resolved task's name.
    task: Optional[str] = None
    model: ModelConfig = field(default_factory=ModelConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # Experiment trackers (conf/tracker/); conf/train.yaml selects tracker=tensorboard by default.
    tracker: TrackerConfig = field(default_factory=TrackerConfig)

    @property
    def resolved_task(self) -> Task:
        """The run's Task object, resolved once by validate_config (the `task` key holds its name)."""
        task = self.__dict__.get("_task")
        if task is None:
            raise ValueError("this TrainConfig did not come from validate_config, which resolves the run's task: "
                             "pass it through src.config.validate_config first")
        return task


@functools.lru_cache(maxsize=None)
def _group_schemas() -> dict[str, type]:
    """The groups' schemas: each core dataclass with the options its owners declare in their own files (the tasks'
    src/tasks/<task>/options.py, the datasets' and model families' registrations): src/dataclass_config.py. Built
    on first use, when reading the task registry loads the tasks."""
    return {"model": model_schema(), "data": extend(data_schema(), task_options("data")),
            "trainer": extend(TrainerConfig, task_options("trainer"))}


@functools.lru_cache(maxsize=None)
def train_schema() -> type[TrainConfig]:
    """TrainConfig with every registered task's, dataset's and model family's keys in its groups: what
    conf/train.yaml composes onto and validate_config checks against."""
    fields = [(group, schema, field(default_factory=schema)) for group, schema in _group_schemas().items()]
    schema = dataclasses.make_dataclass("TrainConfig", fields, bases=(TrainConfig,))
    schema.__module__, schema.__doc__ = __name__, TrainConfig.__doc__
    return schema


def register_train_schema() -> None:
    """Store train_schema() in Hydra's ConfigStore as `train_schema`, the first entry of conf/train.yaml's defaults:
    train.py's body (src/commands/train.py) calls it when imported, as must other code composing conf/train.yaml."""
    ConfigStore.instance().store(name="train_schema", node=train_schema())


def config_dict(config: TrainConfig) -> dict[str, Any]:
    """The resolved config as a plain dict, in the schema's key order: what checkpoints store as `config`."""
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)  # type: ignore[return-value]
