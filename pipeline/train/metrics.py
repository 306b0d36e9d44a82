"""Training metrics: the matmul peak behind MFU (the FLOPs are elmo_model.flops), and the sinks:
metrics.jsonl, wandb (``wandb_run.py``), the driver's console (``progress.py``), the perplexity plot.

Only rank 0 owns a ``MetricsLog``.
"""

from __future__ import annotations

import io
import json
import threading
import time
from typing import Any

import torch

from pipeline.config import to_dict
from pipeline.formats.shard_format import UNIGRAM_METRIC, row_baselines
from pipeline.probe.live import ProbeRow
from pipeline.runtime import storage
from pipeline.runtime.background import WriteQueue
from pipeline.tracking.artifacts import dataset_artifact, model_artifact
from pipeline.train.errors import TrainError
from pipeline.train.export import export_files
from pipeline.train.plan import RunPlan
from pipeline.train.progress import RelaySender
from pipeline.train.run_dir import RunDir, RunWriter
from pipeline.train.wandb_run import STEP_METRIC, WandbRun

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
    (``train``, ``eval``, ``config``, ``event``, ``guard``, ``status``); a row of the same (kind,
    event, step) as an earlier one replaces it (a run resumed from its final checkpoint evaluates
    and closes that step again).

    Written in the background on ``writes`` (the run's records queue, ``run_dir.RunWriter``), so the
    loop never waits for the storage: a local file gets each row appended (a replaced row is
    appended again; :func:`read_metrics` keeps the last), an ``s3://`` one (no appends) the whole
    file again, at most one rewrite queued at a time. At the start the file is cut to the rows of
    the checkpoint a resumed run continues from (``resume_step``).
    """

    def __init__(self, path: str, resume_step: int | None, writes: WriteQueue):
        self.path, self.writes = path, writes
        self.local = not storage.is_s3(path)
        rows: list[dict] = []
        if resume_step is not None and storage.exists(path):
            # rows logged after the checkpoint we resume from will be logged again
            rows = [r for r in read_metrics(path) if int(r.get("step", 0)) <= resume_step]
        self._lock = threading.Lock()
        # (kind, event, step) -> (row, its line, encoded once), in the file's order
        self._entries = {_row_key(r): (r, json.dumps(r) + "\n") for r in rows}
        self._unwritten: list[str] = []  # local: lines not appended yet
        self._whole = True  # the next write is of the whole file: the first, or one after a failure
        writes.submit(self._write, latest=path)

    def append(self, row: dict) -> None:
        """Add ``row`` at the end (replacing an earlier row of its key); raises the error of an
        earlier write that failed (the next write repairs it: the whole file, or what it missed)."""
        key, line = _row_key(row), json.dumps(row) + "\n"
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = (row, line)
            self._unwritten.append(line)
        self.writes.submit(self._write, latest=self.path)

    @property
    def rows(self) -> list[dict]:
        """The rows, in the file's order."""
        with self._lock:
            return [row for row, _ in self._entries.values()]

    def _write(self) -> None:
        """What the file lacks: the lines appended since (local), else the whole file."""
        with self._lock:
            whole = self._whole or not self.local
            lines = [line for _, line in self._entries.values()] if whole else self._unwritten
            self._unwritten, self._whole = [], False
        data = "".join(lines).encode("utf-8")
        try:
            if whole:
                storage.write_bytes(self.path, data)
            else:
                storage.append_local(self.path, data)
        except BaseException:
            with self._lock:
                self._whole = True
            raise


def _row_key(row: dict) -> tuple:
    return row.get("kind"), row.get("event"), int(row.get("step", 0))


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics.jsonl (local or s3://): of rows with the same (kind, event, step), the
    last one, where it stands. A last line cut short (a kill or a power loss during its append:
    no newline after it) is left out; any other line that is not a JSON object is a TrainError
    naming it (see :func:`repair_metrics`)."""
    rows, _torn = _parse_metrics(path)
    latest = {}
    for row in rows:
        key = _row_key(row)
        latest.pop(key, None)
        latest[key] = row
    return list(latest.values())


def _parse_metrics(path: str) -> tuple[list[dict], bool]:
    data = storage.read_bytes(path)
    lines = data.split(b"\n")
    rows, torn = [], False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif number == len(lines):  # the last line, with no newline after it: an append cut short
            torn = True
        else:
            raise TrainError(
                f"{path}: line {number} is not a metrics record (a JSON object); this file is not a "
                "training run's record, or it was damaged: choose another output, or delete the line"
            )
    return rows, torn


def repair_metrics(path: str) -> str | None:
    """Drop a torn last record from ``path`` (rewritten without it, atomically); a one-line
    warning to print when there was one, else None."""
    if not storage.exists(path):
        return None
    rows, torn = _parse_metrics(path)
    if not torn:
        return None
    storage.write_bytes(path, "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8"))
    return (
        f"warning: {path}: its last record was cut short (the run was stopped while writing it) and is "
        "dropped; the run resumes from its latest checkpoint"
    )


# ---- one run's log -------------------------------------------------------------------------------


class RunLog:
    """Where a run's rows go: ``metrics.jsonl`` and wandb (rank 0), and the driver's console through
    ``relay`` (``progress.ProgressRelay``; rank 0, when given). Train rows are due every
    ``cfg.log_every`` steps and at the last step. Nothing here makes a step wait: the files are
    written on the run's records queue (``writer``), and a row goes to the relay as a Ray call that
    is not awaited (``ray.train.report`` would be: Ray Train V2 holds one report per worker until its
    controller's health-check poll takes it, every 2 s; measured 0.8-2.0 s per row in a ``tiny`` run
    logging every 5 steps). Only the final status row is awaited, once, at the end of the run: it is
    the driver's verdict on the run.

    ``plan``: the run's ``RunPlan`` (its directory, name, step count and wandb id); ``world``:
    the workers, which with the batch make the tokens of a step;
    ``resumed_from``: the step a resumed run continues from (rows logged after it are dropped and
    a ``resume`` event is logged), or None for a new run (a ``config`` row is logged).
    """

    def __init__(
        self,
        cfg: Any,
        plan: RunPlan,
        rank: int,
        resumed_from: int | None,
        writer: RunWriter,
        relay: Any = None,
        world: int = 1,
    ):
        self.every = cfg.log_every
        self.relay = RelaySender(relay) if rank == 0 and relay is not None else None
        config = to_dict(cfg)
        run_dir = RunDir(plan.run_dir)
        self.metrics = MetricsLog(run_dir.metrics, resumed_from, writer.records) if rank == 0 else None
        self.wandb = (
            WandbRun(cfg.wandb, plan.run_dir, plan.name, config, plan.wandb_id, writer.records)
            if rank == 0
            else None
        )
        if self.wandb is not None:  # the lineage: what the run reads
            self.wandb.use(dataset_artifact(plan.manifest))
            if plan.init_from:
                self.wandb.use(model_artifact(*export_files(plan.init_from)))
        self.tokens_per_step = cfg.tokens_per_step(world)
        if self.metrics is not None:
            if resumed_from is None:
                self.metrics.append(
                    {"kind": "config", "step": 0, "config": config, "total_steps": plan.ceiling_steps}
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

    def emit(self, row: dict, to_wandb: bool = True) -> dict:
        """One row (``kind``, ``step``, values) to every sink (the relay's call is not awaited), with
        the training tokens seen by its step (``tokens``: per direction, all workers); the row as
        recorded."""
        row = {**row, STEP_METRIC: row["step"] * self.tokens_per_step}
        self._record(row, to_wandb)
        if self.relay is not None:
            self.relay.put(row)
        return row

    def emit_probe(self, probe: ProbeRow) -> None:
        """A live probe: its row as `emit`'s, and on the dashboard with its table and chart."""
        row = self.emit(probe.row, to_wandb=False)
        if self.wandb is not None:
            self.wandb.log_probe(row, probe.table, probe.chart)

    def _record(self, row: dict, to_wandb: bool) -> None:
        if self.metrics is not None:
            self.metrics.append(row)
            if to_wandb:
                self.wandb.log(row, row["step"])

    def produce_model(self, export: str) -> None:
        """The run's export (rank 0, once written) as its ``model`` artifact on the dashboard."""
        if self.wandb is not None:
            self.wandb.produce(model_artifact(*export_files(export)))

    def save_tracking(self) -> None:
        """Bring the wandb files of an s3:// run directory up to date there (with each checkpoint;
        queued)."""
        if self.wandb is not None:
            self.wandb.upload()

    def finish_with(self, status: dict) -> None:
        """Close the run's record with its ``status`` row: metrics.jsonl and wandb (queued: the
        run's ``RunWriter.close()`` waits for them), and the driver, which gets it before this
        returns, after every row before it (``RelaySender.finish``)."""
        self._record(status, to_wandb=False)
        if self.wandb is not None:
            self.wandb.finish()
        if self.relay is not None:
            self.relay.finish(status)


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


def _probe_panel(ax, probes: list[dict]) -> None:
    """The ``probe`` rows' accuracies per layer against step: part of speech solid, word sense
    dashed, one colour per layer."""
    steps = [r["step"] for r in probes]
    for name, style in (("pos", "o-"), ("wsd", "s--")):
        for key in sorted(k for k in probes[-1] if k.startswith(f"probe/{name}_layer")):
            layer = key.rsplit("layer", 1)[1]
            label = f"{'part of speech' if name == 'pos' else 'word sense'}, layer {layer}"
            ax.plot(steps, [100 * r[key] for r in probes], style, color=f"C{layer}", label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("probe accuracy (%)")
    ax.set_title("what the layers know (elmo probe's fixed sample)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def plot_perplexity(rows: list[dict], path: str) -> None:
    """PNG of ``perplexity_series(rows)`` and the held-out baselines (unigram, each Kneser-Ney order)
    vs step (log scale), the splits' ``<UNK>`` rates above;
    beside it, when the run probed its layers (``probe_every``), their accuracies vs step."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    probes = [r for r in rows if r.get("kind") == "probe"]
    if probes:
        fig, (ax, panel) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
        _probe_panel(panel, probes)
    else:
        fig, ax = plt.subplots(figsize=(8, 5))
    for label, steps, values, style, extra in perplexity_series(rows):
        ax.plot(steps, values, style, label=label, **extra)
    evals = [r for r in rows if r.get("kind") == "eval" and UNIGRAM_METRIC in r]
    styles = iter([("gray", "-."), ("black", ":"), ("black", "--"), ("black", "-."), ("black", (0, (1, 4)))])
    for label, value in row_baselines(evals[-1]) if evals else []:
        color, style = next(styles)
        ax.axhline(value, color=color, linestyle=style, label=f"held-out {label} baseline ({value:,.1f})")
    if evals and "eval/heldout_unk_rate" in evals[-1]:
        last = evals[-1]
        ax.set_title(
            f"<UNK>: {last['eval/train_unk_rate']:.2%} of the training tokens, "
            f"{last['eval/heldout_unk_rate']:.2%} of the held-out ones",
            fontsize=9,
        )
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("perplexity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    storage.write_bytes(path, buf.getvalue())
