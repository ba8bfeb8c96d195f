"""How many loader worker processes a process may start: the number asked for, at most its share of the cores.

Every process of a node starts its own loader workers, and each decodes on its own core: 8 workers in each of 2
processes on a 2-core machine do not load faster than 1 each, they compete with the training threads and torch warns
("This DataLoader will create 8 worker processes in total. Our suggested max number of worker in current system is
2 ..."), once per loader. The share is the cores this process may run on (os.sched_getaffinity: a container's or
SLURM's CPU limit, not the machine's) divided by the processes on the node (torchrun's LOCAL_WORLD_SIZE), at least 1.
"""
from __future__ import annotations

import logging
import os

from src import comm

log = logging.getLogger(__name__)
_noted: set[tuple[int, int]] = set()  # (asked, allowed) already said in this process


def available_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def worker_share(cores: int, processes_per_node: int) -> int:
    """Loader workers per process: the cores each of the node's processes has, at least 1."""
    return max(1, cores // max(processes_per_node, 1))


def loader_workers(asked: int, what: str = "data.num_workers") -> int:
    """`asked` loader workers, capped at this process's share of the cores (worker_share); 0 stays 0. Says so once per
    process and setting when it caps (`what` names the setting)."""
    allowed = worker_share(available_cores(), comm.get_local_world_size())
    if asked <= allowed:
        return asked
    if (asked, allowed) not in _noted:
        _noted.add((asked, allowed))
        log.info("%s=%d: using %d loader worker(s) per process, the share of the %d CPU core(s) this process may use "
                 "among the %d process(es) on this node (more would compete with each other and with the model)",
                 what, asked, allowed, available_cores(), comm.get_local_world_size())
    return allowed
