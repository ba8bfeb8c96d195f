"""Stop-signal names as the config spells them (`trainer.preempt_signals`), checked and turned into signals.

Kept apart from src/engine/preemption.py so that src/config.py can validate the key without importing
the training engine that sits above it.
"""
from __future__ import annotations

import signal
from typing import Sequence

UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


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
        if sig in UNCATCHABLE:
            raise ValueError(f"{key}: {sig.name} cannot be caught by any process; use SIGTERM or SIGUSR1")
        if sig not in parsed:
            parsed.append(sig)
    return tuple(parsed)
