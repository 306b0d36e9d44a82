"""What wandb's system charts cost: the CPU time of wandb's own processes during an offline run that
logs twice a second for a minute, with the system statistics off and on (twice each, alternating).

    python benchmarks/wandb_stats.py [--seconds 60]

Prints CPU-seconds per minute of every ``wandb-core`` process (read from /proc, so Linux only).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def wandb_cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by every process whose command line names wandb-core."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"wandb-core" not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:  # the process ended meanwhile
            continue
    return total


def cost(disable_stats: bool, seconds: float) -> float:
    """CPU-seconds per minute of wandb's processes during one offline run."""
    import wandb

    with tempfile.TemporaryDirectory() as folder:
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=disable_stats)
        run = wandb.init(mode="offline", dir=folder, project="stats-cost", settings=settings)
        cpu, start = wandb_cpu_seconds(), time.time()
        for i in range(int(seconds * 2)):
            run.log({"x": i})
            time.sleep(0.5)
        used, elapsed = wandb_cpu_seconds() - cpu, time.time() - start
        run.finish()
        wandb.teardown()
    return used / elapsed * 60


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    print("| system statistics | wandb's CPU-seconds per minute |\n|---|---|")
    for disable in (True, False, True, False):
        print(f"| {'off' if disable else 'on'} | {cost(disable, args.seconds):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
