"""Process-wide state a test can change and must put back: what it is, how to read it, how to restore it.

tests/conftest.py reads every probe before and after each test and fails the test that left a change (naming
the probe and both values), so that no test's result depends on which tests ran before it in the same process
(a serial run and each pytest-xdist worker then mean the same). A test that changes such state on purpose
restores it itself: `monkeypatch` (environment, working directory), `restoring(...)` for one probe, or the
`restores_process_state` fixture for everything (the commands run in-process: they set threads, seeds,
logging and signal handlers as `python train.py` does).

RNG: drawing random numbers is not a change; seeding a global generator is (a later test's "random" data would
follow from this test's seed): torch's global generator by its seed (`torch.initial_seed()`), numpy's and
Python's global generators by their whole state, since no test draws from them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import signal
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist

# Values pytest itself changes around each test, not the test.
_PYTEST_ENV = ("PYTEST_CURRENT_TEST",)
# SIGKILL and SIGSTOP cannot be caught; pytest-timeout (pytest.ini's `timeout`) sets SIGALRM's around each test;
# torch's DataLoader sets SIGCHLD's once per process, at its first worker, and never again (so it must stay).
_NOT_WATCHED = {signal.SIGKILL, signal.SIGSTOP, signal.SIGALRM, signal.SIGCHLD}


@dataclass(frozen=True)
class Probe:
    """One piece of process-wide state: `read` gives a comparable value, `restore` puts one back."""

    name: str
    read: Callable[[], Any]
    restore: Optional[Callable[[Any], None]] = None  # None: cannot be undone in-process (reported only)
    show: Callable[[Any, Any], str] = lambda before, after: f"{before!r} -> {after!r}"


def _backend_flags() -> dict[str, Any]:
    return {
        "cudnn.enabled": torch.backends.cudnn.enabled, "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic, "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "mkldnn.enabled": torch.backends.mkldnn.enabled,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def _set_backend_flags(flags: dict[str, Any]) -> None:
    torch.backends.cudnn.enabled = flags["cudnn.enabled"]
    torch.backends.cudnn.benchmark = flags["cudnn.benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn.deterministic"]
    torch.backends.cudnn.allow_tf32 = flags["cudnn.allow_tf32"]
    torch.backends.cuda.matmul.allow_tf32 = flags["cuda.matmul.allow_tf32"]
    torch.backends.mkldnn.enabled = flags["mkldnn.enabled"]
    torch.set_float32_matmul_precision(flags["float32_matmul_precision"])


def _unfreeze_backend_flags(frozen: bool) -> None:
    # torch.testing._internal (imported by torch.library.opcheck and PyTorch's module_db) calls
    # torch.backends.disable_global_flags() at import, for the rest of the process; PyTorch has no call that
    # undoes it, so the flag is set back in torch.backends' own namespace.
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = not frozen


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _PYTEST_ENV}


def _set_environment(env: dict[str, str]) -> None:
    for key in [k for k in os.environ if k not in env and k not in _PYTEST_ENV]:
        del os.environ[key]
    os.environ.update(env)


def _show_dict(before: dict, after: dict) -> str:
    keys = sorted(set(before) | set(after), key=str)
    return ", ".join(f"{k}: {before.get(k, '<unset>')!r} -> {after.get(k, '<unset>')!r}"
                     for k in keys if before.get(k, "<unset>") != after.get(k, "<unset>"))


def _own_handler(handler: logging.Handler) -> bool:
    return not type(handler).__module__.startswith("_pytest")  # pytest's capture handlers come and go per phase


def _watched_logger(name: str) -> bool:
    # The project's loggers (and the root, which the commands configure). Libraries configure their own loggers
    # when first imported (torch's artifact loggers, MLflow's, torchmetrics'): no test's doing, and no import
    # can be undone.
    return name == "src" or name.startswith(("src.", "tests"))


def _logging() -> dict[str, Any]:
    """Level and handlers of the root logger; level, handlers, propagation of the project's loggers."""
    loggers: dict[str, Any] = {"": (logging.root.level, tuple(filter(_own_handler, logging.root.handlers)))}
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and _watched_logger(name):
            state = (logger.level, tuple(filter(_own_handler, logger.handlers)), logger.propagate, logger.disabled)
            if state != (logging.NOTSET, (), True, False):  # a logger first created by this test is no change
                loggers[name] = state
    loggers["<logging.disable>"] = logging.root.manager.disable
    loggers["<logging.captureWarnings>"] = getattr(logging, "_warnings_showwarning", None) is not None
    return loggers


def _set_logging(state: dict[str, Any]) -> None:
    logging.disable(state["<logging.disable>"])
    logging.captureWarnings(state["<logging.captureWarnings>"])
    level, handlers = state[""]
    _set_handlers(logging.root, handlers, [h for h in logging.root.handlers if not _own_handler(h)])
    logging.root.setLevel(level)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger) or not _watched_logger(name):
            continue
        level, handlers, propagate, disabled = state.get(name, (logging.NOTSET, (), True, False))
        _set_handlers(logger, handlers, [h for h in logger.handlers if not _own_handler(h)])
        logger.setLevel(level)
        logger.propagate, logger.disabled = propagate, disabled


def _set_handlers(logger: logging.Logger, handlers: tuple, keep: list | None = None) -> None:
    for handler in list(logger.handlers):
        if handler not in handlers and handler not in (keep or []):
            logger.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in logger.handlers:
            logger.addHandler(handler)


def _signals() -> dict[int, Any]:
    return {int(s): signal.getsignal(s) for s in signal.valid_signals() if s not in _NOT_WATCHED}


def _set_signals(handlers: dict[int, Any]) -> None:
    for sig, handler in handlers.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


def _show_signals(before: dict, after: dict) -> str:
    return ", ".join(f"{signal.Signals(s).name}: {before[s]!r} -> {after[s]!r}"
                     for s in before if before[s] != after[s])


@dataclass(frozen=True)
class _TorchRng:
    """torch's global generator: compared by its seed (draws are no change), restored with its whole state."""

    seed: int
    state: torch.Tensor = dataclasses.field(compare=False, repr=False)

    def __repr__(self) -> str:
        return f"seed {self.seed}"


def _torch_rng() -> _TorchRng:
    return _TorchRng(torch.initial_seed(), torch.get_rng_state())


def _set_torch_rng(rng: _TorchRng) -> None:
    torch.set_rng_state(rng.state)  # the state holds the seed too


def _numpy_rng() -> tuple:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return kind, keys.tobytes(), pos, has_gauss, gauss


def _set_numpy_rng(state: tuple) -> None:
    kind, keys, pos, has_gauss, gauss = state
    np.random.set_state((kind, np.frombuffer(keys, dtype=np.uint32), pos, has_gauss, gauss))


def _process_group() -> Optional[str]:
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return f"{dist.get_backend()} world of {dist.get_world_size()}"


def _destroy_process_group(before: Optional[str]) -> None:
    if before is None and dist.is_initialized():
        dist.destroy_process_group()


PROBES: tuple[Probe, ...] = (
    Probe("torch intra-op threads (torch.set_num_threads)", torch.get_num_threads, torch.set_num_threads),
    Probe("torch inter-op threads", torch.get_num_interop_threads),  # settable once per process: never in tests
    Probe("default dtype (torch.set_default_dtype)", torch.get_default_dtype, torch.set_default_dtype),
    Probe("torch.use_deterministic_algorithms (enabled, warn_only)", _deterministic,
          lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    Probe("torch.backends flags frozen (torch.backends.disable_global_flags)", torch.backends.flags_frozen,
          _unfreeze_backend_flags),
    Probe("torch backend flags", _backend_flags, _set_backend_flags, _show_dict),
    Probe("environment variables", _environment, _set_environment, _show_dict),
    Probe("working directory", os.getcwd, os.chdir),
    Probe("logging configuration", _logging, _set_logging, _show_dict),
    Probe("signal handlers", _signals, _set_signals, _show_signals),
    Probe("torch's global RNG seed (torch.manual_seed)", _torch_rng, _set_torch_rng),
    Probe("numpy's global RNG (np.random.seed or a draw from it)", _numpy_rng, _set_numpy_rng,
          lambda before, after: "state changed"),
    Probe("Python's global RNG (random.seed or a draw from it)", random.getstate, random.setstate,
          lambda before, after: "state changed"),
    Probe("default process group (torch.distributed)", _process_group, _destroy_process_group),
)


GLOBAL_RNGS = ("torch's global RNG", "numpy's global RNG", "Python's global RNG")
BACKEND_FLAGS = ("torch.backends flags frozen", "torch backend flags")


def snapshot(probes: tuple[Probe, ...] = PROBES) -> dict[str, Any]:
    """Every probe's current value, by name."""
    return {p.name: p.read() for p in probes}


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per probe whose value differs: "<name>: <what changed>"."""
    probes = {p.name: p for p in PROBES}
    return [f"{name}: {probes[name].show(before[name], after[name])}" for name in before
            if before[name] != after[name]]


def restore(before: dict[str, Any]) -> list[str]:
    """Put back every probe of `before` that changed; returns the names of those that cannot be put back."""
    stuck = []
    # Frozen backend flags first: while frozen, setting the flags themselves raises.
    for probe in sorted((p for p in PROBES if p.name in before), key=lambda p: "frozen" not in p.name):
        if probe.read() == before[probe.name]:
            continue
        if probe.restore is None:
            stuck.append(probe.name)
        else:
            probe.restore(before[probe.name])
    return stuck


@contextlib.contextmanager
def restoring(*names: str) -> Iterator[None]:
    """Restore the probes whose names start with one of `names` (all of them without names) on leaving."""
    chosen = tuple(p for p in PROBES if not names or p.name.startswith(names))
    if names and not chosen:
        raise ValueError(f"no process-state probe starts with {names}; probes: {[p.name for p in PROBES]}")
    before = snapshot(chosen)
    try:
        yield
    finally:
        restore(before)
