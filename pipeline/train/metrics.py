"""Training metrics: the matmul peak behind MFU (the FLOPs are elmo_model.flops), and the sinks (metrics.jsonl, wandb (``wandb_run.py``), the perplexity plot).

``ray.train.report`` gets the run's final status row only (`RunLog.finish_with`).
Only rank 0 owns a ``MetricsLog``.
"""

from __future__ import annotations

import io
import json
import threading
import time
from typing import Any

import torch

from pipeline import storage
from pipeline.config import to_dict
from pipeline.train.distributed import barrier
from pipeline.train.plan import RunPlan
from pipeline.train.wandb_run import WandbRun

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "perplexity.png"


# ---- MFU ---------------------------------------------------------------------------------------


def measure_matmul_peak(
    device: torch.device, dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 0.5
) -> float:
    """Achieved FLOP/s of square ``size`` matmuls on ``device`` in ``dtype`` with this process's threads."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    _sync(device)
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        if count % 4 == 0:
            _sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return 2.0 * size**3 * count / elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- metrics.jsonl ---------------------------------------------------------------------------


class MetricsLog:
    """Rows of ``RUN/metrics.jsonl``: one JSON object per line, each with ``step`` and ``kind``
    (``train``, ``eval``, ``config``, ``event``, ``status``); each (kind, step) at most once (events:
    (kind, event, step)).

    S3 has no append, so the whole file is rewritten: by a background thread, so the training loop
    does not wait for the storage (a long run's file is megabytes). A write covers every row added
    before it starts; rows added while it runs get the next one. `flush` waits until the file holds
    every row; the error of a failed write is raised by the next `append` or `flush`, and the rows
    are written again with the next row or `flush`.
    """

    def __init__(self, run_dir: str, resume_step: int | None):
        self.path = storage.join(run_dir, METRICS_FILE)
        rows: list[dict] = []
        if resume_step is not None and storage.exists(self.path):
            # rows logged after the checkpoint we resume from will be logged again
            rows = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= resume_step]
        # (kind, event, step) -> (row, its line, encoded once), in the file's order
        self._entries = {_row_key(r): (r, json.dumps(r) + "\n") for r in rows}
        self._changed = threading.Condition()
        self._version = self._written = 0  # versions of the rows: the newest, and the one stored
        self._failed: int | None = None  # the version whose write failed (tried again once changed)
        self._error: BaseException | None = None
        self._writer: threading.Thread | None = None
        self._closing = False  # the writer is asked to end

    def append(self, row: dict) -> None:
        """Add ``row`` at the end, replacing an earlier row of the same kind and step: a run resumed
        from its final checkpoint evaluates and closes that step again."""
        key, line = _row_key(row), json.dumps(row) + "\n"
        with self._changed:
            self._raise_failed_write()
            self._entries.pop(key, None)  # rare: an earlier row of this key; the new one goes at the end
            self._entries[key] = (row, line)
            self._version += 1
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_changes, name="metrics-writer", daemon=True
                )
                self._writer.start()
            self._changed.notify_all()

    @property
    def rows(self) -> list[dict]:
        """The rows, in the file's order."""
        return [row for row, _ in self._entries.values()]

    def flush(self) -> None:
        """Wait until the file holds every row appended so far; raises a failed write's error."""
        with self._changed:
            self._failed = None  # a version whose write failed is tried again
            self._changed.notify_all()
            self._changed.wait_for(lambda: self._written == self._version or self._error is not None)
            self._raise_failed_write()

    def close(self) -> None:
        """`flush`, then end the writing thread (a later `append` starts another)."""
        self.flush()
        with self._changed:
            writer, self._writer = self._writer, None
            self._closing = writer is not None
            self._changed.notify_all()
        if writer is not None:
            writer.join()

    def _raise_failed_write(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _write_changes(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(
                    lambda: self._version not in (self._written, self._failed) or self._closing
                )
                if self._closing:
                    self._closing = False
                    return
                version, data = (
                    self._version,
                    "".join(line for _, line in self._entries.values()).encode("utf-8"),
                )
            try:
                storage.write_bytes(self.path, data)
            except Exception as err:  # noqa: BLE001 - raised in the loop by the next append or flush
                with self._changed:
                    self._error, self._failed = err, version
                    self._changed.notify_all()
                continue
            with self._changed:
                self._written = version
                self._changed.notify_all()


def _row_key(row: dict) -> tuple:
    return row.get("kind"), row.get("event"), int(row.get("step", 0))


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics.jsonl (local or s3://)."""
    return [
        json.loads(line) for line in storage.read_bytes(path).decode("utf-8").splitlines() if line.strip()
    ]


# ---- one run's log -------------------------------------------------------------------------------


class RunLog:
    """Where a run's rows go: ``metrics.jsonl`` and wandb (rank 0). Train rows are due every
    ``cfg.log_every`` steps and at the last step. With ``report``, every rank also sends the final
    status row to ``ray.train.report`` (the run's ``Result.metrics``), and only that row: Ray Train
    V2 holds one report per worker until its controller's health-check poll takes it (every 2 s),
    so a report within 2 s of the one before blocks the loop until then (measured: 0.8-2.0 s per
    row in a ``tiny`` run logging every 5 steps).

    ``plan``: the run's ``RunPlan`` (its directory, name, step count and wandb id);
    ``resumed_from``: the step a resumed run continues from (rows logged after it are dropped and
    a ``resume`` event is logged), or None for a new run (a ``config`` row is logged).
    """

    def __init__(self, cfg: Any, plan: RunPlan, rank: int, resumed_from: int | None, report: bool):
        self.every, self.report = cfg.log_every, report
        config = to_dict(cfg)
        self.metrics = MetricsLog(plan.run_dir, resumed_from) if rank == 0 else None
        self.wandb = (
            WandbRun(cfg.wandb, plan.run_dir, plan.name, config, plan.wandb_id) if rank == 0 else None
        )
        total_steps = plan.total_steps
        if self.metrics is not None:
            if resumed_from is None:
                self.metrics.append(
                    {"kind": "config", "step": 0, "config": config, "total_steps": total_steps}
                )
            else:
                self.metrics.append(
                    {"kind": "event", "step": resumed_from, "event": "resume", "from_step": resumed_from}
                )

    @property
    def rows(self) -> list[dict]:
        """The rows of metrics.jsonl (rank 0; empty elsewhere)."""
        return self.metrics.rows if self.metrics is not None else []

    def due(self, step: int, last_step: bool) -> bool:
        return step % self.every == 0 or last_step

    def emit(self, row: dict, to_wandb: bool = True) -> None:
        """One row (``kind``, ``step``, values) to every sink."""
        if self.metrics is not None:
            self.metrics.append(row)
            if to_wandb:
                self.wandb.log(row, row["step"])

    def save_tracking(self) -> None:
        """Start bringing the wandb files of an s3:// run directory up to date there (with each
        checkpoint; in the background)."""
        if self.wandb is not None:
            self.wandb.upload()

    def finish_with(self, status: dict) -> None:
        """Close the run with its ``status`` row (metrics.jsonl, then Ray once every rank finished
        its wandb run)."""
        if self.metrics is not None:
            self.metrics.append(status)
            self.metrics.close()
        if self.wandb is not None:
            self.wandb.finish()
        barrier()
        if self.report:
            import ray.train

            ray.train.report(status)


# ---- plot ------------------------------------------------------------------------------------


def perplexity_series(rows: list[dict]) -> list[tuple[str, list[int], list[float], str, dict]]:
    """What ``perplexity.png`` draws, as (label, steps, values, line style, matplotlib options): the
    model's perplexities (held-out at each evaluation; the full-softmax perplexity of the guard's
    held-out sample at each logged step) and, faint and labelled as such, the exponential of the
    sampled-softmax training loss, which is not a perplexity of the model (it sees a few thousand
    rows of the softmax). Series without rows are left out."""
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    guarded = [r for r in train if "guard/perplexity_fwd" in r]
    faint = {"alpha": 0.35, "color": "gray"}
    wanted = [
        (evals, "eval/perplexity", "held-out perplexity", "o-", {}),
        (evals, "eval/perplexity_fwd", "held-out, forward LM", "x:", {}),
        (evals, "eval/perplexity_bwd", "held-out, backward LM", "+:", {}),
        (guarded, "guard/perplexity_fwd", "held-out sample, full softmax, forward LM", "-", {}),
        (guarded, "guard/perplexity_bwd", "held-out sample, full softmax, backward LM", "-", {}),
        (
            train,
            "train/sampled_perplexity",
            "exp(sampled-softmax training loss): not comparable",
            "--",
            faint,
        ),
    ]
    return [
        (label, [int(r["step"]) for r in part], [float(r[key]) for r in part], style, extra)
        for part, key, label, style, extra in wanted
        if part
    ]


def plot_perplexity(rows: list[dict], path: str) -> None:
    """PNG of ``perplexity_series(rows)`` and the held-out unigram baseline vs step (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label, steps, values, style, extra in perplexity_series(rows):
        ax.plot(steps, values, style, label=label, **extra)
    baselines = [
        r["eval/unigram_perplexity"]
        for r in rows
        if r.get("kind") == "eval" and "eval/unigram_perplexity" in r
    ]
    if baselines:
        ax.axhline(baselines[-1], color="gray", linestyle="-.", label="held-out unigram baseline")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("perplexity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    storage.write_bytes(path, buf.getvalue())
