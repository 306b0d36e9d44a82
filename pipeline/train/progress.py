"""Training progress on the driver's console: a line per logged train row and per evaluation.

The workers write their rows to ``metrics.jsonl`` (rank 0; local or s3://), which stays the one
record. The driver follows that file while the run is going (:class:`MetricsFollower`, a thread that
reads what was added to it every ``POLL_SECONDS``) and prints each new ``train`` / ``eval`` row once as a line
(:meth:`ProgressLines.lines`). Reading the record rather than having rank 0 print keeps the lines free of
Ray's per-process prefixes and the same on a laptop and under ``ray job submit``.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections.abc import Callable

from pipeline import storage
from pipeline.train.metrics import METRICS_FILE

POLL_SECONDS = 2.0
CHECKPOINT_WAIT_SHARE = 0.05
"""Waiting for earlier checkpoint saves longer than this share of the time between two train rows
is worth a warning: the storage does not keep up with ``checkpoint_every``."""


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _ppl(value: float) -> str:
    return f"{value:,.1f}" if math.isfinite(value) else "inf"


class ProgressLines:
    """Turns metrics rows into console lines; remembers the previous train row for the ETA.

    ``total_steps``: the run's last step (for ``step/total`` and the ETA).
    """

    def __init__(self, total_steps: int):
        self.total_steps = total_steps
        self._last: tuple[int, float] | None = None  # (step, time) of the previous train row
        self._warned_checkpoints = False

    def lines(self, row: dict) -> list[str]:
        """The lines for a row: one for a ``train``, ``eval`` or ``guard`` row, none for other kinds;
        after a train row, once per run, a warning when saves waited for earlier ones too long."""
        if row.get("kind") == "train":
            return self._train(row)
        if row.get("kind") == "eval":
            scope = ""
            if "eval/batches" in row and "eval/seconds" in row:
                scope = f" [{row['eval/batches']} batches, {row['eval/seconds']:.1f} s]"
            return [
                f"eval  step {row['step']}/{self.total_steps}: held-out perplexity "
                f"{_ppl(row['eval/perplexity'])} (fwd {_ppl(row['eval/perplexity_fwd'])}, "
                f"bwd {_ppl(row['eval/perplexity_bwd'])}; unigram {_ppl(row['eval/unigram_perplexity'])}){scope}"
            ]
        if row.get("kind") == "guard":
            return [f"guard step {row['step']}/{self.total_steps}: {row['message']} [{row['action']}]"]
        return []

    def _train(self, row: dict) -> list[str]:
        step, elapsed = int(row["step"]), float(row["time"])
        eta, since = "", elapsed  # the time since the previous row (or since the attempt started)
        if self._last is not None and step > self._last[0] and elapsed > self._last[1]:
            since = elapsed - self._last[1]
            eta = f" | ETA {_duration(since / (step - self._last[0]) * (self.total_steps - step))}"
        self._last = (step, elapsed)
        guard = ""
        if "guard/perplexity_fwd" in row:
            guard = (
                f"held-out sample (full softmax) fwd {_ppl(row['guard/perplexity_fwd'])} "
                f"bwd {_ppl(row['guard/perplexity_bwd'])} | "
            )
        # the sampled softmax's loss is no perplexity of the model: said so, beside the full-softmax one
        line = (
            f"train step {step}/{self.total_steps} (epoch {row['epoch']:.2f}) | sampled perplexity fwd "
            f"{_ppl(row['train/sampled_perplexity_fwd'])} bwd {_ppl(row['train/sampled_perplexity_bwd'])} | "
            f"{guard}{row['train/tokens_per_s']:,.0f} tok/s | MFU {100 * row['train/mfu']:.2f}%{eta}"
        )
        return [line, *self._checkpoint_warning(row, since)]

    def _checkpoint_warning(self, row: dict, since: float) -> list[str]:
        waited = float(row.get("checkpoint/wait_s", 0.0))
        if self._warned_checkpoints or since <= 0 or waited < CHECKPOINT_WAIT_SHARE * since:
            return []
        self._warned_checkpoints = True
        return [
            f"warning: training waited {waited:.1f} s of the last {since:.1f} s ({waited / since:.0%}, up to "
            f"step {row['step']}) for checkpoint saves to finish writing: the run directory's storage "
            "writes a checkpoint slower than checkpoint_every steps take; raise checkpoint_every or use "
            "faster storage (checkpoint/wait_s in metrics.jsonl and wandb has each interval's wait; said once)"
        ]


class MetricsFollower:
    """While the body of ``with MetricsFollower(run_dir, total_steps):`` runs, print the new rows
    of ``run_dir/metrics.jsonl`` (those of steps after ``from_step``) as lines on ``out``; a last
    read on exit catches the final rows."""

    def __init__(
        self,
        run_dir: str,
        total_steps: int,
        from_step: int = 0,
        out: Callable[[str], None] | None = None,
        poll_seconds: float = POLL_SECONDS,
    ):
        self.path = storage.join(run_dir, METRICS_FILE)
        self.lines = ProgressLines(total_steps)
        self.out = out or (lambda text: print(text, file=sys.stderr, flush=True))
        self.poll_seconds = poll_seconds
        self._printed: set[tuple[str, int, int]] = set()
        self._offset, self._last_line = 0, b""  # bytes of the file read so far, and its last line
        self._from_step = from_step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="metrics-follower", daemon=True)

    def __enter__(self) -> MetricsFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.print_new()

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.print_new()

    def print_new(self) -> None:
        """Print the rows not printed yet. A read that fails (the file not there yet, a storage
        hiccup) is skipped: the record is the workers', and the next poll reads it again."""
        try:
            rows = self._new_rows()
        except (storage.StorageError, ValueError):
            return
        for row in rows:
            # a rollback of the divergence guard logs its steps again
            key = (str(row.get("kind")), int(row.get("step", 0)), int(row.get("guard/rollbacks", 0)))
            if key in self._printed or key[1] <= self._from_step:
                continue
            self._printed.add(key)
            for text in self.lines.lines(row):
                self.out(text)

    def _new_rows(self) -> list[dict]:
        """The rows written since the last read. The workers rewrite the file whole, but only ever
        add rows at its end (a row replaced on a rerun moves to the end), so only the bytes after
        the last read are fetched, from the last line read on: if that line is no longer where it
        was, the file changed before it and is read whole (the printed keys skip the rows seen)."""
        start = self._offset - len(self._last_line)
        data = storage.read_from(self.path, start)
        if data is None:
            return []
        if data.startswith(self._last_line):
            data = data[len(self._last_line) :]
        else:
            self._offset, self._last_line = 0, b""
            data = storage.read_from(self.path, 0) or b""
        complete = data[: data.rfind(b"\n") + 1]  # a line without its newline is not whole yet
        if complete:
            self._offset += len(complete)
            self._last_line = complete[complete.rstrip(b"\n").rfind(b"\n") + 1 :]
        return [json.loads(line) for line in complete.decode("utf-8").splitlines() if line.strip()]
