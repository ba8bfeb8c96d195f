"""The typed training config: the schema conf/train.yaml is checked against, and validate_config().

sections.py holds the optim, sched and trainer groups (checks.py their shared value checks), tracker.py the tracker
group; the data, model and norm groups own their dataclasses (src/data/config.py, src/models/config.py).
schema.py builds TrainConfig with every owner's keys once the registries are loaded (importing this package
imports no task); validation.py resolves the run's task and runs every check before any process group starts;
renamed_groups.py refuses the command line's old group names. The names below are the package's API.
"""
from __future__ import annotations

from src.config.renamed_groups import RENAMED_GROUPS, refuse_renamed_groups
from src.config.schema import (DEVICES, TrainConfig, config_dict, data_config, register_train_schema, task_options,
                               train_schema)
from src.config.sections import (AMP_MODES, BUFFER_SYNC, COMPILE_MODES, DTYPES, EARLY_STOP_MODES, OPTIMIZERS,
                                 SCHEDULES, UNCATCHABLE_SIGNALS, EarlyStopConfig, OptimConfig, SchedConfig,
                                 TrainerConfig, parse_signals)
from src.config.tracker import (CsvTrackerConfig, MlflowTrackerConfig, TensorBoardTrackerConfig, TrackerConfig,
                                WandbTrackerConfig)
from src.config.validation import best_metric_of, validate_config

__all__ = [
    "AMP_MODES", "BUFFER_SYNC", "COMPILE_MODES", "DEVICES", "DTYPES", "EARLY_STOP_MODES", "OPTIMIZERS", "RENAMED_GROUPS",
    "SCHEDULES", "UNCATCHABLE_SIGNALS", "CsvTrackerConfig", "EarlyStopConfig", "MlflowTrackerConfig", "OptimConfig",
    "SchedConfig", "TensorBoardTrackerConfig", "TrackerConfig", "TrainConfig", "TrainerConfig", "WandbTrackerConfig",
    "best_metric_of", "config_dict", "data_config", "parse_signals", "refuse_renamed_groups", "register_train_schema",
    "task_options", "train_schema", "validate_config",
]
