"""Preemption-safe training: a stop signal ends the run at the next optimizer step, on every rank.

Clusters end jobs with a signal and a grace period: SLURM sends SIGTERM (or the signal chosen with
`sbatch --signal=SIG@SECONDS`) and SIGKILL a while later, `docker stop` and torchrun send SIGTERM.
`Preemption` turns the signals of `trainer.preempt_signals` into a request: the handler only records
the signal, so the optimizer step, evaluation or checkpoint write under way finishes normally. At
the trainer's safe points (after every optimizer step, after an epoch's evaluation and checkpoint)
every rank calls `stop_requested()`, one small collective, so all ranks stop after the same step
even when the signal reached only some of them, or reached them at different steps.
`PreemptionHook` does that inside the Trainer: last.pt is written, the run ends, and train.py exits
with EXIT_PREEMPTED; `trainer.resume=auto` continues exactly from there.

Ctrl-C (SIGINT) is always handled the same way while training, whatever trainer.preempt_signals says: the
first one is acknowledged at once on rank 0's console and stops every rank after the step under way, with
last.pt written and one line that names the step, the checkpoint and the command that continues the run;
the exit code is then EXIT_INTERRUPTED. A second SIGINT ends the process at once (a checkpoint being written
stays the previous one: writes are atomic). Under torchrun the terminal's SIGINT reaches only torchrun, which
passes it to the workers once: a second Ctrl-C ends torchrun, while the workers still finish and save.
"""
from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Optional, Sequence

from src import comm
from src.config import parse_signals
from src.engine.hooks import Hook, TrainerView

log = logging.getLogger(__name__)

# EX_TEMPFAIL of sysexits.h ("temporary failure; the user is invited to retry"): the run stopped on
# purpose with its state saved, and running the same command again (trainer.resume=auto) continues it.
EXIT_PREEMPTED = 75
# 128 + SIGINT: what a shell reports for a program Ctrl-C ended; here after last.pt was written.
EXIT_INTERRUPTED = 128 + signal.SIGINT
_ACKNOWLEDGED = (b"\nCtrl-C: finishing this step, then saving a checkpoint (press Ctrl-C again to quit at once, "
                 b"without saving)\n")

class Preemption:
    """Catches the configured signals while installed and decides, with the other ranks, when to stop.

    Use as a context manager around training; the previous handlers come back on exit. With no
    signals configured it catches nothing and `stop_requested()` is False without communicating.
    `interrupt=True` also handles SIGINT as Ctrl-C (see the module's docstring); `announce` prints its
    acknowledgement (rank 0).
    """

    def __init__(self, signals: Sequence[str | signal.Signals], interrupt: bool = False,
                 announce: bool = False) -> None:
        names = [s.name if isinstance(s, signal.Signals) else s for s in signals]
        self.signals = parse_signals([*names, "SIGINT"] if interrupt else names)
        self.interrupt, self.announce = interrupt, announce
        self.interrupts = 0  # SIGINTs received (interrupt=True)
        self.received: Optional[str] = None  # name of the first signal this process got
        self.received_at: Optional[float] = None
        self._agreed: Optional[str] = None
        self.interrupted = False  # the ranks stopped for a Ctrl-C (any rank's): set by stop_requested()
        self._replaced: dict[signal.Signals, Any] = {}  # the handlers install() replaced (kept for pass_on)

    def install(self) -> "Preemption":
        """Install the handlers (main thread only, as Python requires for signal handlers)."""
        for sig in self.signals:
            self._replaced[sig] = signal.signal(sig, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Put back the handlers that were there before install()."""
        for sig, previous in self._replaced.items():
            signal.signal(sig, previous)

    def pass_on(self) -> None:
        """Give the signal received to the Python handler it had replaced, if any.

        Under Hydra's submitit launcher that handler is submitit's own, which requeues the job.
        Default and ignore dispositions, and Python's KeyboardInterrupt handler, are left alone.
        """
        if self.received is None:
            return
        sig = signal.Signals[self.received]
        previous = self._replaced.get(sig)
        if callable(previous) and previous not in (self._on_signal, signal.default_int_handler):
            previous(int(sig), None)

    def ignore_until_exit(self) -> None:
        """While installed: ignore the signals from now on (SIG_IGN); uninstall() still restores.

        A Python handler is not enough for a process on its way out: interpreter finalization resets
        every signal with a Python handler to its default action, so a SIGTERM during the last second
        of shutdown would kill the process; an ignored signal stays ignored until the process exits.
        """
        for sig in self._replaced:
            if not (sig == signal.SIGINT and self.interrupt):  # a second Ctrl-C still ends the process at once
                signal.signal(sig, signal.SIG_IGN)

    def __enter__(self) -> "Preemption":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        # Only record: this runs between two bytecodes of whatever the main thread does (a collective,
        # a checkpoint write, logging with its locks held), so it must not do any of that itself.
        if signum == signal.SIGINT and self.interrupt:
            self.interrupts += 1
            if self.interrupts > 1:  # the second Ctrl-C: end now, as SIGINT's default action does
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
                return
            if self.announce:
                os.write(2, _ACKNOWLEDGED)  # not logging: its locks may be held by the code interrupted
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
        if comm.any_rank(self.received is not None):
            self._agreed = self.received or "a signal on another rank"
            # Once, at the stop: whether it is a Ctrl-C on any rank (then every rank exits as interrupted).
            self.interrupted = self.interrupt and comm.any_rank(self.received == "SIGINT")
            level = logging.DEBUG if self.interrupted else logging.WARNING  # Ctrl-C was acknowledged already
            log.log(level, "%s received: stopping after this optimizer step, on every rank", self._agreed)
            return True
        return False

    @property
    def reason(self) -> str:
        """What the run is stopping for (after stop_requested() returned True)."""
        if self.interrupted:
            return "Ctrl-C (SIGINT)"
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


class PreemptionHook(Hook):
    """The Trainer hook (src/engine/hooks.py protocol): stop with last.pt saved when a stop signal came.

    Checked after every optimizer step, and after each epoch's evaluation and checkpoint (a signal
    that arrived during them stops the run there, the epoch already saved). `loaders` are DataLoaders
    besides the trainer's own (the validation loader) whose workers must survive the signal too.
    """

    def __init__(self, signals: Sequence[str], loaders: Sequence[Any] = (), continue_command: str = "") -> None:
        """`continue_command`: the command that continues this run, for the line a Ctrl-C ends with."""
        self.preemption = Preemption(signals, interrupt=True, announce=comm.is_main_process())
        self.loaders = list(loaders)
        self.continue_command = continue_command
        self.stopped_after: Optional[int] = None

    def before_train(self, trainer: TrainerView) -> None:
        """Install the handlers; loader workers ignore the signals (the trainer decides when to stop)."""
        if not self.preemption.signals:
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("training runs outside the main thread: trainer.preempt_signals are not handled")
            return
        self.preemption.install()
        for loader in [trainer.loader, *self.loaders]:
            if getattr(loader, "num_workers", 0) > 0:
                loader.worker_init_fn = self.preemption.data_worker_init(loader.worker_init_fn)

    def after_step(self, trainer: TrainerView) -> None:
        """Stop after this step, with last.pt, when any rank got a signal."""
        if trainer.stop_reason is not None:  # training ends here anyway (the same on every rank)
            return
        if self.preemption.stop_requested():
            trainer.request_checkpoint()
            self._stop(trainer)

    def after_epoch(self, trainer: TrainerView) -> None:
        """A signal during evaluation or the epoch's checkpoint: stop now (this state is saved already)."""
        if not trainer.finishing and trainer.stop_reason is None and self.preemption.stop_requested():
            self._stop(trainer)

    def after_train(self, trainer: TrainerView) -> None:
        """Say how to continue and pass the signal on; put the previous handlers back unless stopped.

        A run stopped for preemption ignores the stop signals from here until the process exits:
        torchrun SIGTERMs the other workers the moment the first one exits with EXIT_PREEMPTED, and a
        worker that is past its last collective, with last.pt written, should end with that exit code
        too rather than be killed by the default SIGTERM action while it closes its logs, its process
        group and the interpreter. (torchrun still SIGKILLs a worker that has not exited after its
        shutdown timeout.)
        """
        if self.stopped_after is None:
            self.preemption.uninstall()
            return
        self.preemption.ignore_until_exit()
        where = trainer.saver.dir if trainer.saver is not None else "the run directory"
        if self.preemption.interrupted:  # one line on the console (rank 0); the other ranks' go to their logs
            level = logging.WARNING if comm.is_main_process() else logging.INFO
            log.log(level, "interrupted after step %d; checkpoint: %s; continue with: %s", self.stopped_after,
                    _shown(where / "last.pt" if trainer.saver is not None else where),
                    self.continue_command or "the same command with trainer.resume=<run folder>")
            return
        log.warning("stopped on %s after optimizer step %d; last.pt in %s; run the same command with "
                    "trainer.resume=auto to continue (exit code %d)", self.preemption.reason,
                    self.stopped_after, where, EXIT_PREEMPTED)
        self.preemption.pass_on()  # e.g. submitit's handler, which requeues the job

    def _stop(self, trainer: TrainerView) -> None:
        self.stopped_after = trainer.state.progress.step
        if self.preemption.interrupted:
            trainer.request_stop(self.preemption.reason, exit_code=EXIT_INTERRUPTED)
        else:
            trainer.request_stop(f"{self.preemption.reason} (preemption)", exit_code=EXIT_PREEMPTED)


def _shown(path: Any) -> str:
    """`path` relative to the working directory when below it (as a user would type it)."""
    try:
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
    except ValueError:
        return str(path)
