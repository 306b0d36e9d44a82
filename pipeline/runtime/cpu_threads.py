"""How many torch threads a CPU process takes on a machine it may share.

torch's OpenMP threads wait for each other at the end of every parallel region, spinning: with more
threads than the cores left free by other work, each region waits for a thread the scheduler has
parked, and the spinning ones burn the cores the others need. Measured on the 2-core machine at a
load of 6-7 (docs/reliability.md#the-probe-on-a-busy-machine): the probe with 2 threads took 343 s
and 225 s of CPU, with 1 thread 250 s and 90 s of CPU.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call (macOS)
        return os.cpu_count() or 1


def free_cores() -> int:
    """The usable cores less the machine's 1-minute load average (rounded), at least 1: all of
    them on a quiet machine, one on a saturated one."""
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average (Windows)
        return cores
    return max(1, min(cores, cores - round(load)))
