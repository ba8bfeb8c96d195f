"""Resuming a run from its folder: the run's saved config is the base, and the keys given on the command line apply
where a resume can honour them; any other change is refused, naming the key and both values.

What a resume can honour: how long the run goes on, how it is evaluated, logged, checkpointed and tracked, where
and how fast it runs. Everything else says what is trained (model, norm, data, batch sizes, optimizer, schedule,
precision, augmentation, seed); changing it would make the checkpoint unusable or the continuation another
training. Such a change is a new run: start one from the checkpoint (`trainer.resume=<its file>`) in a new folder.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from src.commands.run_dir import HydraLaunch
from src.errors import UserError

# Keys (and whole groups) a resume takes from the command line. A key not listed keeps the run's value.
RESUMABLE = (
    "trainer.resume",
    # how long: the LR schedule is fitted to the new length (src/engine/checkpoint/schedule.py)
    "trainer.epochs", "trainer.max_steps",
    # evaluation, logging, checkpoints, early stopping's patience
    "trainer.eval_every", "trainer.log_every", "trainer.checkpoint_every", "trainer.keep_best",
    "trainer.early_stop.patience", "trainer.early_stop.min_delta", "trainer.progress_bar", "trainer.tensorboard",
    "tracker",
    # where and how fast it runs (the same training, possibly other float rounding)
    "device", "norm.cuda_selfcheck", "trainer.num_threads", "trainer.eval_num_threads", "trainer.compile",
    "trainer.compile_mode", "trainer.channels_last", "trainer.activation_checkpointing", "trainer.deterministic",
    "trainer.ddp_bucket_cap_mb", "trainer.gradient_as_bucket_view", "trainer.dry_run",
    # accumulation: the global batch (processes x data.batch_size x grad_accum_steps) is checked on its own
    "trainer.grad_accum_steps",
    # timeouts and signals
    "trainer.dist_timeout_s", "trainer.dist_init_timeout_s", "trainer.preempt_signals",
    # loading the data (not what it is)
    "data.root", "data.download", "data.num_workers", "data.pin_memory", "data.persistent_workers",
    "data.prefetch_factor", "data.eval_batch_size", "data.cache",
)
_MISSING = "<not set>"


def resumable(key: str) -> bool:
    """True when a resume may take `key` (dotted) from the command line."""
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE)


@dataclass
class Change:
    """A key whose command-line value differs from the run's."""

    key: str
    run: Any
    given: Any

    def __str__(self) -> str:
        return f"{self.key}: {_show(self.run)} (the run) -> {_show(self.given)} (command line)"


def merge_for_resume(saved: dict[str, Any], composed: dict[str, Any], launch: HydraLaunch,
                     saved_choices: dict[str, Any], folder: str) -> tuple[dict[str, Any], list[Change]]:
    """`saved` with the command line's changes applied; returns it and the changes honoured.

    `composed` is the config Hydra composed from the command line (plain, resolved). Only the keys the command
    line gave count (a group given with the run's own option counts as not given); without Hydra's record of
    them (`launch.overrides` None: run() called from code) every key of `composed` counts. UserError lists every
    change a resume cannot honour.
    """
    changes = list(_given_changes(saved, composed, launch, saved_choices))
    refused = [c for c in changes if not resumable(c.key)]
    if refused:
        ckpt = f"{folder}/checkpoints/last.pt"
        raise UserError(
            f"trainer.resume={folder} continues that run with its own settings, but the command line changes "
            f"what it trains:\n  " + "\n  ".join(map(str, refused)) + "\nDrop these overrides to continue the "
            f"run (a resume needs only trainer.resume=<run folder>), or train with them as a new run that starts "
            f"from its checkpoint: trainer.resume={ckpt} hydra.run.dir=<a new folder> plus the run's other "
            f"settings (its .hydra/overrides.yaml)")
    merged = copy.deepcopy(saved)
    for change in changes:
        _set(merged, change.key, change.given)
    return merged, changes


def _given_changes(saved: dict[str, Any], composed: dict[str, Any], launch: HydraLaunch,
                   saved_choices: dict[str, Any]) -> Iterator[Change]:
    seen: set[str] = set()
    changed: list[str] = []  # a changed key's value is taken whole: its own keys are not compared again
    for prefix in _given_prefixes(composed, launch, saved_choices):
        for key in sorted(_leaves(_get(saved, prefix), prefix) | _leaves(_get(composed, prefix), prefix)):
            if key in seen or any(key.startswith(k + ".") for k in changed):
                continue
            seen.add(key)
            run, given = _get(saved, key), _get(composed, key)
            if run != given:
                changed.append(key)
                yield Change(key, run, given)


def _given_prefixes(composed: dict[str, Any], launch: HydraLaunch, saved_choices: dict[str, Any]) -> list[str]:
    """The dotted keys (or subtrees) the command line set: "" (everything) when that is not known."""
    if launch.overrides is None:
        return [""]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    prefixes = []
    for override in OverridesParser.create().parse_overrides(launch.overrides):
        key = override.key_or_group
        if key.startswith("hydra.") or key == "hydra":
            continue  # Hydra's own settings (hydra.run.dir is the run folder, handled by the caller)
        if key in launch.choices or key in saved_choices:  # a config group
            if launch.choices.get(key, _MISSING) == saved_choices.get(key, _MISSING) != _MISSING:
                continue  # the run's own option: its values stay, with whatever the run set on top of them
            prefixes.append(key if key in composed else "")  # a `# @package _global_` group sets keys anywhere
        else:
            prefixes.append(key)
    return prefixes


def _leaves(node: Any, prefix: str) -> set[str]:
    if isinstance(node, dict) and node:
        return {leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}.{k}" if prefix else str(k))}
    return {prefix} if prefix else set()


def _get(tree: Any, key: str) -> Any:
    node = tree
    for part in key.split(".") if key else []:
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _set(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if value == _MISSING:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(value)


def _show(value: Any) -> str:
    return value if value == _MISSING else repr(value)


def global_batch_change(run_world: int, run_cfg: dict[str, Any], world: int, batch: int, accum: int
                        ) -> Optional[str]:
    """None when processes x data.batch_size x trainer.grad_accum_steps equals the run's, else what to say."""
    run_batch, run_accum = int(run_cfg["data"]["batch_size"]), int(run_cfg["trainer"].get("grad_accum_steps", 1))
    before, now = run_world * run_batch * run_accum, world * batch * accum
    if before == now:
        return None
    fix = ""
    if before % (world * batch) == 0:
        fix = f"; with {world} process(es), trainer.grad_accum_steps={before // (world * batch)} keeps it"
    return (f"the global batch (processes x data.batch_size x trainer.grad_accum_steps) would change: "
            f"{run_world} x {run_batch} x {run_accum} = {before} (the run) -> {world} x {batch} x {accum} = {now} "
            f"(this launch){fix}")
