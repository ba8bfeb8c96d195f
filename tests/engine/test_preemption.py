"""src/engine/preemption.py on its own: real signals to this process, and real gloo ranks that must agree
on the step to stop at."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from src.engine.preemption import Preemption, PreemptionHook
from src.config import parse_signals
from tests.support.gloo import run_on_ranks

REPO = Path(__file__).resolve().parents[2]


def test_signal_names_are_parsed_and_bad_ones_name_the_key() -> None:
    assert parse_signals(["SIGTERM", "usr1", "SIGUSR1"]) == (signal.SIGTERM, signal.SIGUSR1)
    assert parse_signals([]) == ()
    with pytest.raises(ValueError, match=r"trainer.preempt_signals: unknown signal 'SIGFOO'"):
        parse_signals(["SIGFOO"])
    with pytest.raises(ValueError, match="SIGKILL cannot be caught"):
        parse_signals(["SIGKILL"])


def test_a_signal_is_only_recorded_and_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    with Preemption(["SIGUSR1"]) as preemption:
        assert not preemption.stop_requested()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)  # Python runs the handler at the next bytecode of the main thread
        assert preemption.received == "SIGUSR1"
        os.kill(os.getpid(), signal.SIGUSR1)  # a second signal (torchrun forwards what SLURM also sent)
        assert preemption.stop_requested() and preemption.stop_requested()
        assert preemption.reason == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is before


def test_the_replaced_handler_gets_the_signal_after_the_stop() -> None:
    # Under Hydra's submitit launcher that handler is submitit's, which requeues the job.
    seen: list[int] = []
    before = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    try:
        with Preemption(["SIGUSR2"]) as preemption:
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.05)
            assert seen == [] and preemption.received == "SIGUSR2"  # nothing passed on while training
        preemption.pass_on()
        assert seen == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, before)


def test_a_stopped_run_ignores_stop_signals_until_exit_and_an_unstopped_one_restores() -> None:
    # torchrun SIGTERMs the other workers as soon as the first exits 75; a worker already past its
    # last collective must still exit 75 itself, not die of the default SIGTERM action.
    before = signal.getsignal(signal.SIGUSR2)
    finished = PreemptionHook(["SIGUSR2"])
    finished.preemption.install()
    finished.after_train(SimpleNamespace(saver=None))
    assert signal.getsignal(signal.SIGUSR2) is before

    stopped = PreemptionHook(["SIGUSR2"])
    stopped.preemption.install()
    try:
        stopped.preemption.received = "SIGUSR2"
        stopped.stopped_after = 3
        stopped.after_train(SimpleNamespace(saver=None))
        # SIG_IGN, not a Python handler: finalization resets Python handlers to the default action.
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR2)  # with the default action restored this would end pytest
        time.sleep(0.05)
    finally:
        stopped.preemption.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is before


# A stopped worker whose interpreter shutdown is slow (here: 1.5 s in a finalizer), SIGTERMed in the
# middle of it, as torchrun does to the remaining workers once the first has exited 75.
_SLOW_EXIT = r"""
import signal, sys, time
from types import SimpleNamespace
from src.engine.preemption import EXIT_PREEMPTED, PreemptionHook
hook = PreemptionHook(["SIGTERM"])
hook.preemption.install()
hook.preemption.received, hook.stopped_after = "SIGTERM", 3
hook.after_train(SimpleNamespace(saver=None))
class SlowFinalizer:
    def __del__(self):
        time.sleep(1.5)
slow = SlowFinalizer()
print("stopped", flush=True)
sys.exit(EXIT_PREEMPTED)
"""


def test_a_stopped_worker_exits_75_when_sigtermed_during_interpreter_shutdown() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_EXIT], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "stopped"
    time.sleep(0.5)  # inside the finalizer's sleep
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 75, "SIGTERM during shutdown killed a worker that had already stopped"


def test_no_signals_configured_catches_nothing() -> None:
    preemption = Preemption([]).install()
    try:
        assert preemption.signals == () and not preemption.stop_requested()
        assert signal.getsignal(signal.SIGUSR2) is not preemption._on_signal
    finally:
        preemption.uninstall()


def test_signal_during_a_checkpoint_write_lets_it_finish(tmp_path: Path) -> None:
    # A write in progress is not interrupted: the handler only records the signal.
    from src.engine.checkpoint.files import CheckpointSaver, load_checkpoint

    saver = CheckpointSaver(tmp_path, "top1", 0, higher_is_better=True)  # the trainer's atomic writer
    payload = {"step": 7, "model": {"w": torch.full((8 * 2**20,), 7.0)}}  # 32 MiB: the write takes a while
    with Preemption(["SIGUSR1"]) as preemption:
        timer = threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        path = saver.write(payload)
        written = time.monotonic()
        timer.join()
        time.sleep(0.05)
        assert preemption.stop_requested()
    # Handled while the write was under way (it takes far longer than the timer's 10 ms) ...
    assert preemption.received_at is not None and preemption.received_at < written
    # ... and the file is complete.
    state = load_checkpoint(path)
    assert state["step"] == 7 and bool((state["model"]["w"] == 7.0).all())


def _stop_steps(rank: int, world: int, scenarios: list[dict[int, int]]) -> list[int]:
    """For each scenario {rank: step it signals itself at}: the step after which this rank stopped."""
    stopped = []
    for signal_steps in scenarios:
        with Preemption(["SIGUSR1"]) as preemption:
            for step in range(1, 50):
                if signal_steps.get(rank) == step:
                    os.kill(os.getpid(), signal.SIGUSR1)
                    time.sleep(0.05)
                if preemption.stop_requested():
                    break
            stopped.append(step)
    return stopped


def test_ranks_agree_on_the_step_to_stop_at() -> None:
    # Only rank 1 is signalled (step 4); ranks 0 and 2 at different steps (9 and 5): the first one wins.
    assert run_on_ranks(3, _stop_steps, [{1: 4}, {0: 9, 2: 5}]) == [[4, 5]] * 3


_DATA_WORKER = r"""
import os, signal, sys, time
import torch
from torch.utils.data import DataLoader, Dataset
from src.engine.preemption import Preemption

class Slow(Dataset):
    def __len__(self): return 40
    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.tensor(i)

preemption = Preemption(["SIGTERM"]).install()
for mode in ("data_worker_init", "default"):
    loader = DataLoader(Slow(), batch_size=2, num_workers=2)
    if mode == "data_worker_init":
        loader.worker_init_fn = preemption.data_worker_init()
    seen = 0
    try:
        for batch in loader:
            seen += 1
            if seen == 3:
                os.killpg(os.getpgrp(), signal.SIGTERM)  # as torchrun stops a worker: its whole process group
        print(mode, "batches", seen, flush=True)
    except RuntimeError as err:
        print(mode, "failed:", err, flush=True)
"""


def test_data_workers_survive_the_signal_with_data_worker_init() -> None:
    proc = subprocess.run([sys.executable, "-c", _DATA_WORKER], cwd=REPO, capture_output=True, text=True,
                          timeout=120, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "data_worker_init batches 20" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    # What it prevents: without it the loader's workers die and take the epoch with them.
    assert "default failed: DataLoader worker" in proc.stdout, proc.stdout + proc.stderr[-3000:]


# Ctrl-C twice, as a terminal sends it: the first is acknowledged and recorded, the second ends the process at once.
_CTRL_C_TWICE = r"""
import os, signal, sys, time
from src.engine.preemption import Preemption
preemption = Preemption([], interrupt=True, announce=True).install()
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.05)
print("stop requested:", preemption.stop_requested(), preemption.reason, flush=True)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(5)
print("still running", flush=True)
"""


def test_the_first_ctrl_c_asks_to_stop_and_the_second_ends_the_process_at_once() -> None:
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_TWICE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.stdout == "stop requested: True Ctrl-C (SIGINT)\n", proc.stdout + proc.stderr
    assert proc.stderr.count("Ctrl-C: finishing this step, then saving a checkpoint") == 1
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
    assert proc.returncode == -signal.SIGINT  # ended by the signal itself, as the shell expects of Ctrl-C
