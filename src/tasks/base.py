"""The task interface: everything that differs between classification, segmentation, detection, ...

A task is one object, registered once (src/tasks/registry.py) by its package src/tasks/<task>/, under the name
that its datasets are registered with (`@DATASETS.register(..., task="detection")`); it uses every model whose
family produces what it reads (`model_output`). Config validation resolves the run's task once (the one model
and dataset have in common, or `task=`: `config.resolved_task`) and hands it down; the engine and the commands
only call these members and never ask which task it is running (docs/tasks.md is the guide).

Who calls what:
- config validation: `metrics` and their directions (`higher_is_better`), `per_class_prefix`, `config_options`
  (the task's keys in the config groups, src/dataclass_config.py), `validate(config)`;
- the training run: `data` (TaskData: transforms and collation of Batches, src/data/batch.py), `options(config)`
  (one object) for `loss(options)` and `batch_mix(options, ...)`, `forward` (training mode), `train_hooks`;
- evaluation (src/evaluation/loop.py; the protocol it calls: src/evaluation/protocol.py): `eval_forward` of each
  batch, `evaluator(context)`, whose `process` sees every batch's outputs and whose `compute` (every rank,
  collectives) returns the metrics;
- TensorBoard: `log_train_samples`, `log_eval_pictures`;
- predict.py: `predict_options`, `predict_settings`, `predict_batch_size`, `eval_forward`, `predict`; export.py:
  `eval_forward`, `export_output`, `export_size`; the dry run: `describe_output`.

The defaults below are those of a model that maps a stacked image batch to one tensor (a classifier); a task
overrides what differs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from torch import nn

from src.data.task_data import TaskData
from src.dataclass_config import section
from src.evaluation.protocol import EvalContext, Evaluator

MAX, MIN = "max", "min"  # which way a metric improves
Loss = Callable[[Any, Any], torch.Tensor]  # (model outputs, targets) -> the micro-batch's mean loss


class Task:
    """One kind of problem; subclass and register an instance (src/tasks/registry.py)."""

    name: str = ""
    # What it reads of a model's outputs (src/models/registry.py's kinds: IMAGE_LOGITS, PIXEL_LOGITS, ...): the
    # models it uses are those whose family produces that, so a new task reuses every model that fits it.
    model_output: str = ""
    # Validation metrics and which way each improves (MAX or MIN); the first ranks best-k checkpoints by default.
    metrics: Mapping[str, str] = {}
    # Per-class metrics named <prefix><class> also exist (e.g. "iou_"), improving this way.
    per_class_prefix: Optional[str] = None
    per_class_direction: str = MAX
    data: TaskData  # the data layer's part of the task: transforms and collation (src/data/task_data.py)
    # The keys this task adds to config groups, by group ("data", "trainer"): a dataclass each, in the task's
    # options.py, which src/config/schema.py adds to the group's schema (the keys stay data.crop_size, ...). Each
    # dataclass's validate() checks them; a run of another task refuses them when set.
    config_options: Mapping[str, type] = {}
    predict_options: Optional[type] = None  # predict.py's keys this task reads (e.g. topk), a dataclass
    exportable: bool = True  # whether export.py writes its models (False: export_output says why not)

    # --- config --------------------------------------------------------------------------------------------
    @property
    def default_metric(self) -> str:
        """What trainer.best_metric=auto ranks checkpoints by."""
        return next(iter(self.metrics))

    def knows_metric(self, name: str) -> bool:
        """Whether evaluation reports `name` (a per-class metric counts)."""
        return name in self.metrics or (self.per_class_prefix is not None and name.startswith(self.per_class_prefix))

    def higher_is_better(self, metric: str) -> bool:
        """The direction this task declares for `metric` (an EMA twin `ema_<name>` goes its model's way): what
        best-k checkpoints and early stopping's mode=auto rank by. ValueError for a metric it does not report."""
        name = metric if self.knows_metric(metric) else metric.removeprefix("ema_")
        if name in self.metrics:
            return self.metrics[name] == MAX
        if self.knows_metric(name):
            return self.per_class_direction == MAX
        raise ValueError(f"{metric!r} is not a {self.name} metric; its metrics: {', '.join(self.metrics)}"
                         + (f", {self.per_class_prefix}<class name>" if self.per_class_prefix else ""))

    def validate(self, config: Any) -> None:
        """Refuse, before any process starts, what this task cannot do with `config` (a TrainConfig): its own
        options' values (each config_options dataclass's validate()), and what a subclass adds."""
        for group, schema in self.config_options.items():
            options = section(getattr(config, group), schema)
            if hasattr(options, "validate"):
                options.validate()

    def predict_settings(self, cfg: Any, config: Any = None) -> Any:
        """predict.py's options of this task from its config `cfg` (predict_options, validated), or None; `config` is
        the trained run's (a TrainConfig, or None), for what a task's predictions need of it (e.g. to show its inputs
        as they were before normalisation)."""
        if self.predict_options is None:
            return None
        options = section(cfg, self.predict_options)
        if hasattr(options, "validate"):
            options.validate()
        return options

    # --- training ------------------------------------------------------------------------------------------
    def forward(self, module: nn.Module, images: Any, targets: Any) -> Any:
        """The training forward of a Batch's images and targets (src/data/batch.py); models that compute their own
        losses take the targets here."""
        return module(images)

    def options(self, config: Any) -> Any:
        """This task's options of the run `config` (a validated TrainConfig), as one object: what its loss, batch
        mixing and pictures read (default: none)."""
        return None

    def loss(self, options: Any) -> Loss:
        """The training loss of `forward`'s outputs, with the run's `options()` (a subclass must say)."""
        raise NotImplementedError(f"task {self.name!r} defines no training loss")

    def batch_mix(self, options: Any, num_classes: int) -> Optional[Callable[[Any, Any], tuple[Any, Any]]]:
        """What mixes each training batch and its targets before the forward (MixUp, CutMix), or None."""
        return None

    def train_hooks(self, config: Any, *, writer: Any) -> Sequence[Any]:
        """The task's own hooks of a training run (src/engine/hooks.py's protocol: objects with any of before_train,
        after_step, after_epoch, after_train, run on every rank); they run after each evaluation and before the
        checkpoint that records it (default: none). `writer`: rank 0's TensorBoard SummaryWriter, or None."""
        return ()

    def describe_output(self, outputs: Any) -> str:
        """The dry run's one-line description of a forward's outputs."""
        return str(tuple(outputs.shape))

    # --- evaluation ----------------------------------------------------------------------------------------
    def eval_forward(self, module: nn.Module, images: Any) -> Any:
        """The evaluation-mode forward of a Batch's images (no targets): what evaluation, predict.py, the dry run's
        eval-mode forward and export.py's file compute; `evaluator`, `predict` and `export_output` read its
        outputs."""
        return module(images)

    def evaluator(self, context: EvalContext) -> Evaluator:
        """A fresh accumulator for one evaluation (a subclass must say)."""
        raise NotImplementedError(f"task {self.name!r} defines no evaluator")

    # --- pictures (TensorBoard, rank 0; never communicating) ------------------------------------------------
    def log_train_samples(self, writer: Any, images: Any, targets: Any, step: int, *, mean: Sequence[float],
                          std: Sequence[float]) -> None:
        """Pictures of a training batch, once per run (default: none)."""

    def log_eval_pictures(self, writer: Any, model: nn.Module, dataset: Any, step: int, device: torch.device, *,
                          mean: Sequence[float], std: Sequence[float], amp: str) -> None:
        """Pictures after an evaluation (default: none)."""

    # --- predict.py / export.py -----------------------------------------------------------------------------
    def predict_batch_size(self, requested: int) -> int:
        """predict.py's batch size (tasks whose inputs keep their own sizes may need 1)."""
        return requested

    def predict(self, batches: Any, forward: Callable[[Any], Any], *, files: list[Path], out_dir: Path,
                class_names: list[str], batch_count: int, options: Any) -> Path:
        """Write predict.py's output for this rank's `batches` (Batches of images and indices, no targets) and
        return what was written (every rank calls it; rank 0 writes). `forward(batch)` runs the model in eval mode
        under the run's autocast; `files` are the inputs' relative paths, by index; `batch_count` this rank's
        number of batches; `options` this task's predict_settings (e.g. topk)."""
        raise NotImplementedError(f"predict.py does not support task {self.name!r}")

    def export_output(self, outputs: Any) -> torch.Tensor:
        """The one tensor export.py's file returns of the model's eval outputs (default: the outputs)."""
        return outputs

    def export_size(self, train_data: Any) -> int:
        """The side of export.py's example image for a run trained with data config `train_data`."""
        return int(train_data.image_size)

