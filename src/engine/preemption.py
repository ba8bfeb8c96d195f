"""Preemption-safe training: a stop signal ends the run at the next optimizer step, on every rank.

Clusters end jobs with a signal and a grace period: SLURM sends SIGTERM (or the signal chosen with
`sbatch --signal=SIG@SECONDS`) and SIGKILL a while later, `docker stop` and torchrun send SIGTERM.
`Preemption` turns the signals of `trainer.preempt_signals` into a request: the handler only records
the signal, so the optimizer step, evaluation or checkpoint write under way finishes normally. At
the trainer's safe points (after every optimizer step, after an epoch's evaluation and checkpoint)
every rank calls `stop_requested()`, one small collective, so all ranks stop after the same step
even when the signal reached only some of them, or reached them at different steps. The trainer
then writes last.pt and raises `Preempted`, which exits with EXIT_PREEMPTED; `trainer.resume=auto`
continues exactly from there.
"""
from __future__ import annotations

import functools
import logging
import signal
import time
from types import FrameType
from typing import Any, Callable, Optional, Sequence

from src import dist

log = logging.getLogger(__name__)

# EX_TEMPFAIL of sysexits.h ("temporary failure; the user is invited to retry"): the run stopped on
# purpose with its state saved, and running the same command again (trainer.resume=auto) continues it.
EXIT_PREEMPTED = 75

_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def parse_signals(names: Sequence[str], key: str = "trainer.preempt_signals") -> tuple[signal.Signals, ...]:
    """Signal names ("SIGTERM", "USR1", case-insensitive) as signals; ValueError naming `key` otherwise."""
    parsed: list[signal.Signals] = []
    for name in names:
        text = str(name).strip().upper()
        text = text if text.startswith("SIG") else "SIG" + text
        sig = getattr(signal.Signals, text, None)
        if sig is None:
            raise ValueError(f"{key}: unknown signal {name!r}; use names such as SIGTERM, SIGUSR1, SIGUSR2, "
                             "SIGINT, SIGHUP, or [] to disable preemption handling")
        if sig in _UNCATCHABLE:
            raise ValueError(f"{key}: {sig.name} cannot be caught by any process; use SIGTERM or SIGUSR1")
        if sig not in parsed:
            parsed.append(sig)
    return tuple(parsed)


class Preempted(SystemExit):
    """Raised once the run has stopped for a signal and its checkpoint is written; exits EXIT_PREEMPTED."""

    def __init__(self, signal_name: str, step: int, checkpoint: Optional[str]) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint

    def __str__(self) -> str:
        saved = f"state saved to {self.checkpoint}" if self.checkpoint else "state saved"
        return (f"stopped on {self.signal_name} after optimizer step {self.step}, {saved}; run the same command "
                f"with trainer.resume=auto to continue (exit code {EXIT_PREEMPTED})")


class Preemption:
    """Catches the configured signals while installed and decides, with the other ranks, when to stop.

    Use as a context manager around training; the previous handlers come back on exit. With no
    signals configured it catches nothing and `stop_requested()` is False without communicating.
    """

    def __init__(self, signals: Sequence[str | signal.Signals]) -> None:
        self.signals = parse_signals([s.name if isinstance(s, signal.Signals) else s for s in signals])
        self.received: Optional[str] = None  # name of the first signal this process got
        self.received_at: Optional[float] = None
        self._agreed: Optional[str] = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> "Preemption":
        """Install the handlers (main thread only, as Python requires for signal handlers)."""
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Put back the handlers that were there before install()."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def __enter__(self) -> "Preemption":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        # Only record: this runs between two bytecodes of whatever the main thread does (a collective,
        # a checkpoint write, logging with its locks held), so it must not do any of that itself.
        if self.received is None:
            self.received, self.received_at = signal.Signals(signum).name, time.monotonic()

    def stop_requested(self) -> bool:
        """True on every rank once any rank got a signal; call on all ranks at the same points.

        One all-reduce of a single integer (on NCCL also a device sync), skipped when no signal is
        configured. Once True it stays True without communicating again.
        """
        if self._agreed is not None:
            return True
        if not self.signals:
            return False
        if dist.any_rank(self.received is not None):
            self._agreed = self.received or "a signal on another rank"
            log.warning("%s received: stopping after this optimizer step, on every rank", self._agreed)
            return True
        return False

    @property
    def reason(self) -> str:
        """What the run is stopping for (after stop_requested() returned True)."""
        return self._agreed or self.received or "no signal"

    def data_worker_init(self, chained: Optional[Callable[[int], None]] = None) -> Callable[[int], None]:
        """A DataLoader `worker_init_fn` that makes its workers ignore the stop signals.

        torchrun signals a worker's whole process group and SLURM every process of the job step, so
        DataLoader workers get the signal too; by default it kills them, and the trainer then fails
        with "DataLoader worker exited unexpectedly" before it can save. The trainer decides when to
        stop; its loader workers end with it.
        """
        return functools.partial(_ignore_in_data_worker, tuple(int(s) for s in self.signals), chained)


def _ignore_in_data_worker(signals: tuple[int, ...], chained: Optional[Callable[[int], None]],
                           worker_id: int) -> None:
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)
    if chained is not None:
        chained(worker_id)
