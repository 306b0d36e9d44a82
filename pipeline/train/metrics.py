"""Training metrics: FLOP counts and MFU, and the sinks (metrics.jsonl, wandb, the perplexity plot).

``ray.train.report`` is the third sink; the training loop calls it (every rank must).
Only rank 0 owns a ``MetricsLog``.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
import time
from typing import Any

import torch

from pipeline import storage

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "perplexity.png"
WANDB_MODES = ("offline", "online", "disabled")


# ---- FLOPs and MFU ---------------------------------------------------------------------------


def encoder_flops_per_token(options: dict) -> int:
    """Forward multiply-adds x 2 of one token through the char CNN, highway and projection."""
    cnn = options["char_cnn"]
    chars, dim_c = int(cnn["max_characters_per_token"]), int(cnn["embedding"]["dim"])
    n_filters = sum(int(n) for _, n in cnn["filters"])
    conv = sum(2 * (chars - int(w) + 1) * int(w) * dim_c * int(n) for w, n in cnn["filters"])
    highway = int(cnn.get("n_highway", 0)) * 2 * n_filters * 2 * n_filters
    proj_dim = int(options["lstm"]["projection_dim"])
    projection = 2 * n_filters * proj_dim if n_filters != proj_dim else 0
    return conv + highway + projection


def lstm_flops_per_token(options: dict) -> int:
    """Forward FLOPs of one token through one direction's LSTM stack (gates + projection)."""
    lstm = options["lstm"]
    dim, proj, layers = int(lstm["dim"]), int(lstm["projection_dim"]), int(lstm["n_layers"])
    return layers * (2 * (proj + proj) * 4 * dim + 2 * dim * proj)


def train_flops_per_token(options: dict, softmax_columns: int) -> int:
    """Training FLOPs (forward + backward = 3 x forward) per token of one direction's stream.

    Each of the two streams encodes its own tokens, runs its LSTM and scores ``softmax_columns``
    classes (S + 1 sampled, or V for the full softmax) per position. A step of B x U positions
    costs ``2 * B * U * train_flops_per_token``.
    """
    proj = int(options["lstm"]["projection_dim"])
    forward = encoder_flops_per_token(options) + lstm_flops_per_token(options) + 2 * proj * softmax_columns
    return 3 * forward


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


def perplexity(loss: float) -> float:
    """exp(loss), inf on overflow."""
    return math.exp(loss) if loss < 700 else math.inf


class MetricsLog:
    """Rows of ``RUN/metrics.jsonl``: one JSON object per line, each with ``step`` and ``kind``
    (``train``, ``eval``, ``config``, ``event``). The whole file is rewritten on every write, as S3 has no append."""

    def __init__(self, run_dir: str, resume_step: int | None):
        self.path = storage.join(run_dir, METRICS_FILE)
        self.rows: list[dict] = []
        if resume_step is not None and storage.exists(self.path):
            # rows logged after the checkpoint we resume from will be logged again
            self.rows = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= resume_step]

    def append(self, row: dict) -> None:
        self.rows.append(row)
        self.flush()

    def flush(self) -> None:
        storage.write_bytes(self.path, "".join(json.dumps(r) + "\n" for r in self.rows).encode("utf-8"))


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics.jsonl (local or s3://)."""
    return [
        json.loads(line) for line in storage.read_bytes(path).decode("utf-8").splitlines() if line.strip()
    ]


# ---- wandb -----------------------------------------------------------------------------------


class WandbSink:
    """A wandb run (offline by default). Offline runs are written under ``RUN/wandb`` (for an s3
    run directory: written locally, then uploaded there by ``finish``)."""

    def __init__(self, settings: Any, run_dir: str, name: str, config: dict):
        mode = str(settings.mode)
        if mode not in WANDB_MODES:
            raise ValueError(f"wandb.mode must be one of {', '.join(WANDB_MODES)}, got {mode!r}")
        if mode == "online" and not os.environ.get("WANDB_API_KEY"):
            raise ValueError(
                "wandb.mode=online needs WANDB_API_KEY in the environment; use wandb.mode=offline"
            )
        self.run_dir = run_dir
        self.run = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        if mode == "disabled":
            return
        import wandb

        if storage.is_s3(run_dir):
            self._tmp = tempfile.TemporaryDirectory(prefix="elmo-wandb-")
            local = self._tmp.name
        else:
            local = run_dir
            os.makedirs(local, exist_ok=True)
        self.run = wandb.init(
            mode=mode,
            dir=local,
            project=str(settings.project),
            entity=str(settings.entity) or None,
            name=name,
            config=config,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )

    def log(self, row: dict, step: int) -> None:
        if self.run is not None:
            self.run.log(
                {k: v for k, v in row.items() if isinstance(v, int | float) and k != "step"}, step=step
            )

    def finish(self) -> None:
        if self.run is None:
            return
        self.run.finish()
        self.run = None
        if self._tmp is not None:
            root = self._tmp.name
            for dirpath, _, files in os.walk(root):
                for name in files:
                    full = os.path.join(dirpath, name)
                    if not os.path.islink(full):
                        storage.upload_file(full, storage.join(self.run_dir, os.path.relpath(full, root)))
            self._tmp.cleanup()


# ---- plot ------------------------------------------------------------------------------------


def plot_perplexity(rows: list[dict], path: str) -> None:
    """PNG of train and held-out perplexity (forward, backward, average) and the unigram baseline vs step."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    for key, style in (
        ("train/perplexity", "-"),
        ("train/perplexity_fwd", ":"),
        ("train/perplexity_bwd", ":"),
    ):
        if train:
            ax.plot([r["step"] for r in train], [r[key] for r in train], style, label=key)
    for key, style in (
        ("eval/perplexity", "o-"),
        ("eval/perplexity_fwd", "x:"),
        ("eval/perplexity_bwd", "+:"),
    ):
        if evals:
            ax.plot([r["step"] for r in evals], [r[key] for r in evals], style, label=key)
    baselines = [r["eval/unigram_perplexity"] for r in evals if "eval/unigram_perplexity" in r]
    if baselines:
        ax.axhline(baselines[-1], color="gray", linestyle="--", label="held-out unigram")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("perplexity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    storage.write_bytes(path, buf.getvalue())
