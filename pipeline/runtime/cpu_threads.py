"""How many torch threads a CPU process takes on a machine it may share.

torch's OpenMP threads wait for each other at the end of every parallel region, spinning: with more
threads than the cores left free by other work, each region waits for a thread the scheduler has
parked, and the spinning ones burn the cores the others need. Measured on the 2-core machine at a
load of 6-7 (docs/reliability.md#the-probe-on-a-busy-machine): the probe with 2 threads took 343 s
and 225 s of CPU, with 1 thread 250 s and 90 s of CPU. On the quiet machine 2 threads are faster
(137 s against 196 s), so the choice follows what is free now: the machine's idle share over half a
second, not the load average, which still counts a pipeline's own stages of the last minute.
"""

from __future__ import annotations

import os
import time

SAMPLE_S = 0.5
"""How long the machine's idle time is watched."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call (macOS)
        return os.cpu_count() or 1


def _cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of all CPUs since boot (Linux's /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields[:8])  # idle + iowait; user .. steal


def idle_share(seconds: float = SAMPLE_S) -> float:
    """The machine's idle share over ``seconds``, 0..1 (OSError where there is no /proc/stat)."""
    idle0, total0 = _cpu_times()
    time.sleep(seconds)
    idle1, total1 = _cpu_times()
    return (idle1 - idle0) / max(total1 - total0, 1)


def free_cores() -> int:
    """The usable cores times the machine's idle share now (rounded), at least 1: all of them on a
    quiet machine, one on a saturated one."""
    cores = usable_cores()
    try:
        idle = idle_share()
    except OSError:  # no /proc/stat (macOS, Windows)
        return cores
    return max(1, min(cores, round(cores * idle)))
