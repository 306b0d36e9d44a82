"""Stopping a training run at a step boundary when its driver is asked to (docs/reliability.md#stopping).

A scheduler stops a job with SIGTERM (Slurm, Kubernetes, systemd, ``timeout``), a person with
Ctrl-C. The driver then asks the run to stop (``ProgressRelay.request_stop``) and gives it a grace
period; every rank must stop after the same step, and that step's checkpoint is what a rerun
continues from. Rank 0 asks the relay without waiting for the answer, and every rank learns rank
0's answer at the same steps: a broadcast at each check. Checks come about every ``CHECK_SECONDS``
of the loop (rank 0 sets the next interval from the pace it measures, and the ranks receive it
with the answer), so a run with slow steps is asked as often as one with fast ones, and a GPU's
step pipeline waits once per check, not per step.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from pipeline.train.distributed import broadcast_from_rank0

CHECK_SECONDS = 2.0
"""About how often the ranks look whether the driver asked them to stop."""
MAX_INTERVAL = 1000
"""Most steps between two checks (a very fast step)."""


class StopCheck:
    """``due(step)``: whether this step is a check; ``check(step)``: every rank's agreed answer
    (rank 0's, broadcast on ``device``), True when the run should stop after this step.
    ``relay``: the driver's ``ProgressRelay`` (rank 0; None: no driver, never asked to stop)."""

    def __init__(self, relay: Any, rank: int, device: torch.device):
        self.relay = relay if rank == 0 else None
        self.device = device
        self.next_check = 1
        self._asked = None  # rank 0's question in flight
        self._previous: tuple[int, float] | None = None  # (step, time) of rank 0's last check

    def due(self, step: int) -> bool:
        return step >= self.next_check

    def check(self, step: int) -> bool:
        answer, interval = 0, 1
        if self.relay is not None:
            answer = int(self._answer())
            now = time.perf_counter()
            if self._previous is not None and step > self._previous[0]:
                pace = (now - self._previous[1]) / (step - self._previous[0])
                interval = max(1, min(MAX_INTERVAL, int(CHECK_SECONDS / max(pace, 1e-9))))
            self._previous = (step, now)
        agreed = broadcast_from_rank0(torch.tensor([answer, interval], dtype=torch.int64, device=self.device))
        answer, interval = (int(v) for v in agreed.tolist())
        self.next_check = step + interval
        return bool(answer)

    def _answer(self) -> bool:
        """The relay's answer to the question asked at an earlier check (then asked again); False
        while it is still on its way, or when the relay is gone (nobody is left to ask)."""
        import ray

        if self._asked is None:
            self._asked = self.relay.stop_requested.remote()
            return False
        ready, _ = ray.wait([self._asked], timeout=0)
        if not ready:  # still on its way: asked again once it is back
            return False
        asked, self._asked = self._asked, self.relay.stop_requested.remote()
        try:
            return bool(ray.get(asked))
        except ray.exceptions.RayError:
            self.relay = None
            return False
