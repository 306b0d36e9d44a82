"""A training run's directory (local or ``s3://``): every path in it, and how a run writes there.

Layout of ``RUN/``:
- ``run.json``: the run's name, wandb id and the data it trains on (``launch``);
- ``lease.json``: the heartbeat of the driver running it (``pipeline/output_folder.py``);
- ``metrics.jsonl``: one JSON row per line, the run's record (``metrics``);
- ``checkpoints/step-NNNNNNNNN/``: checkpoints (``checkpoint``);
- ``wandb/attempt-NNN/``: each attempt's offline wandb files (``wandb_run``);
- ``export/``: options.json, weights.hdf5, softmax.hdf5, vocab.txt at the end (``export``);
- ``perplexity.png``: the plot at the end (``metrics``).

What a rank writes while it trains goes through :class:`RunWriter`: one rule (``WriteQueue``: in
order, errors raised at the next call, waited for at the end of the run) in two queues, so that a
slow checkpoint upload never holds back the metrics and wandb files: ``records`` and
``checkpoints``. Local files are appended to; an ``s3://`` directory (no appends) gets the whole
metrics file again at each log interval and the new wandb files at each checkpoint, so a crash
loses at most one interval there. Under a driver, every write first checks that the driver's
lease on the directory is still this run's (``pipeline.output_folder.fence``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.output_folder import LEASE_FILE, OwnFiles
from pipeline.runtime import storage
from pipeline.runtime.background import WriteQueue

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "perplexity.png"
CHECKPOINTS = "checkpoints"
WANDB_DIR = "wandb"
EXPORT_DIR = "export"
OWN_FILES = OwnFiles(
    "train",
    RUN_FILE,
    re.compile(
        rf"{RUN_FILE}|{LEASE_FILE}|{re.escape(METRICS_FILE)}|{re.escape(PLOT_FILE)}"
        rf"|({CHECKPOINTS}|{WANDB_DIR}|{EXPORT_DIR})/.+"
    ),
)
"""What a run writes into its directory (``pipeline/output_folder.py``): another folder is refused."""


@dataclass(frozen=True)
class RunDir:
    """The paths of run directory ``root`` (absolute, local or ``s3://``)."""

    root: str

    def path(self, *parts: str) -> str:
        return storage.join(self.root, *parts)

    @property
    def is_s3(self) -> bool:
        return storage.is_s3(self.root)

    @property
    def run_file(self) -> str:
        return self.path(RUN_FILE)

    @property
    def lease(self) -> str:
        return self.path(LEASE_FILE)

    @property
    def metrics(self) -> str:
        return self.path(METRICS_FILE)

    @property
    def plot(self) -> str:
        return self.path(PLOT_FILE)

    @property
    def checkpoints(self) -> str:
        return self.path(CHECKPOINTS)

    def checkpoint(self, step: int) -> str:
        """``RUN/checkpoints/step-000001250``."""
        return self.path(CHECKPOINTS, f"step-{step:09d}")

    @property
    def wandb(self) -> str:
        return self.path(WANDB_DIR)

    @property
    def export(self) -> str:
        return self.path(EXPORT_DIR)


class RunWriter:
    """The background writes of one rank into its run directory: ``records`` (metrics.jsonl and
    wandb files) and ``checkpoints``, each a ``WriteQueue``. ``close()`` at the end of the run
    waits for both and raises the first error."""

    def __init__(self, fence: Callable[[], None] | None = None) -> None:
        """``fence``: checked before every write (``pipeline.output_folder.fence``: the run still holds
        its directory's lease)."""
        self.records = WriteQueue("run-records", fence)
        self.checkpoints = WriteQueue("run-checkpoints", fence)

    def close(self) -> None:
        try:
            self.checkpoints.close()
        finally:
            self.records.close()
