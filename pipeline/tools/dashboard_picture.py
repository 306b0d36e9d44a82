"""A picture of what a pipeline's wandb group shows, drawn from its offline files (no wandb server):
the lineage of its artifacts, the training curves against tokens, the probe's table and the runs'
summaries. The README's picture is this tool's, on ``make demo``'s output.

    python -m pipeline.tools.dashboard_picture runs/demo docs/images/dashboard-demo.png

``runs/demo`` is an ``elmo pipeline`` run's folder (local): its ``shards/``, ``train/``,
``embeddings/`` and ``probe/`` each hold their stage's ``wandb/attempt-NNN/`` files.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.formats.shard_format import row_baselines
from pipeline.tracking import offline_reader

STAGES = ("shards", "train", "embeddings", "probe")
"""The folders of a pipeline run, in the order of its stages."""
COLUMNS = {
    "shard": 0,
    "dataset": 1,
    "train": 2,
    "model": 3,
    "embed": 4,
    "probe": 4,
    "embeddings": 5,
    "probe-report": 5,
}
"""Where the lineage panel puts each run (by job type) and artifact (by type), left to right."""


@dataclass
class StageRecords:
    """One stage's runs as its offline files hold them (every attempt, in order)."""

    job_type: str
    group: str
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    artifacts: list[dict] = field(default_factory=list)
    media: list[Path] = field(default_factory=list)
    """The attempts' ``files`` folders (tables and images live there)."""


def read_stage(folder: Path) -> StageRecords | None:
    """The records of the stage whose output is ``folder``; None when it logged no run."""
    files = offline_reader.run_files(folder / "wandb")
    if not files:
        return None
    stage = None
    for path in files:
        recs = offline_reader.records(path)
        try:
            run = offline_reader.run_record(recs)
            history, summary = offline_reader.history(recs), offline_reader.summary(recs)
        except offline_reader.OfflineFileError as err:
            raise offline_reader.OfflineFileError(f"wandb run file {path}: {err}") from None
        if stage is None:
            stage = StageRecords(run.get("job_type", "?"), run.get("run_group", ""))
        stage.history += history
        stage.summary.update(summary)
        stage.artifacts += [
            a for a in offline_reader.artifacts(recs) if a.get("artifact_type") != "run_table"
        ]
        stage.media.append(path.parent / "files")
    return stage


def lineage(stages: list[StageRecords]) -> tuple[dict[str, tuple[str, int]], set[tuple[str, str]]]:
    """Nodes (label -> (kind, column)) and edges (from, to) of the group's lineage graph: a run to
    the artifacts it logged, an artifact to the runs that used it."""
    nodes: dict[str, tuple[str, int]] = {}
    edges: set[tuple[str, str]] = set()
    for stage in stages:
        run = f"{stage.job_type} run"
        nodes[run] = ("run", COLUMNS.get(stage.job_type, 2))
        for artifact in stage.artifacts:
            label = f"{artifact['name']}\n({artifact['artifact_type']})"
            nodes[label] = ("artifact", COLUMNS.get(artifact["artifact_type"], 3))
            edges.add((label, run) if artifact.get("use_after_commit") else (run, label))
    return nodes, edges


def _draw_lineage(ax, stages: list[StageRecords]) -> None:
    nodes, edges = lineage(stages)
    by_column: dict[int, list[str]] = {}
    for label, (_, column) in nodes.items():
        by_column.setdefault(column, []).append(label)
    where = {}
    for column, labels in by_column.items():
        for i, label in enumerate(sorted(labels)):
            where[label] = (column, (len(labels) - 1) / 2 - i)
    for start, end in sorted(edges):
        (x0, y0), (x1, y1) = where[start], where[end]
        ax.annotate(
            "", xy=(x1 - 0.38, y1), xytext=(x0 + 0.38, y0), arrowprops={"arrowstyle": "->", "color": "0.4"}
        )
    for label, (kind, _) in nodes.items():
        x, y = where[label]
        colour = "#dbe9f6" if kind == "run" else "#dff0d8"
        ax.text(
            x,
            y,
            label,
            ha="center",
            va="center",
            fontsize=7,
            bbox={"boxstyle": "round", "fc": colour, "ec": "0.5"},
        )
    ax.set_xlim(-0.6, max(c for _, c in nodes.values()) + 0.6)
    ax.set_ylim(-1.2, 1.2)
    ax.axis("off")
    ax.set_title("lineage: runs (blue) and their artifacts (green)", fontsize=9)


def _draw_curves(ax, train: StageRecords) -> None:
    evals = [r for r in train.history if "eval/perplexity" in r and "tokens" in r]
    trains = [r for r in train.history if "train/sampled_perplexity" in r and "tokens" in r]
    guard = [r for r in train.history if "guard/perplexity_fwd" in r and "tokens" in r]
    ax.plot(
        [r["tokens"] for r in trains],
        [r["train/sampled_perplexity"] for r in trains],
        color="0.6",
        label="train/sampled_perplexity",
    )
    ax.plot(
        [r["tokens"] for r in guard],
        [(r["guard/perplexity_fwd"] + r["guard/perplexity_bwd"]) / 2 for r in guard],
        color="tab:orange",
        label="guard/perplexity (held-out sample)",
    )
    ax.plot(
        [r["tokens"] for r in evals], [r["eval/perplexity"] for r in evals], "o-", label="eval/perplexity"
    )
    last = evals[-1] if evals else {}
    for (label, value), style in zip(
        row_baselines(last), (":", "--", "-.", (0, (1, 4)), (0, (3, 1, 1, 1))), strict=False
    ):
        ax.axhline(value, linestyle=style, color="0.3", label=f"{label} ({value:,.1f})")
    ax.set_yscale("log")
    ax.set_xlabel("tokens (the step metric of every curve)")
    ax.legend(fontsize=7, loc="upper right")
    best = train.summary.get("best/perplexity")
    ax.set_title(
        f"train: held-out perplexity (summary best/perplexity {best:.1f})" if best else "train", fontsize=9
    )


def _draw_probe(ax, probe: StageRecords) -> None:
    row = next(r for r in probe.history if "probe/table" in r)
    media = next(m for m in probe.media if (m / row["probe/table"]["path"]).exists())
    table = json.loads((media / row["probe/table"]["path"]).read_text())
    columns = [c for c in table["columns"][1:] if c.startswith("layer")]
    width = 0.8 / len(table["data"])
    for i, values in enumerate(table["data"]):
        heights = [values[table["columns"].index(c)] for c in columns]
        ax.bar([k + i * width for k in range(len(columns))], heights, width, label=values[0])
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(columns))], columns)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=6)
    ax.set_title("probe: probe/table (accuracy per layer)", fontsize=9)


SUMMARY_KEYS = {
    "shard": ("train/tokens", "heldout/tokens", "train/unk_rate", "heldout/unk_rate", "vocab/size",
              "baselines/unigram_perplexity", "baselines/kneser_ney_3gram_perplexity",
              "baselines/kneser_ney_5gram_perplexity"),
    "train": ("best/perplexity", "best/perplexity_to_unigram", "best/perplexity_to_kneser_ney_3gram",
              "best/perplexity_to_kneser_ney_5gram", "best/tokens"),
    "embed": ("output/tokens", "output/shards", "run/tokens_per_s"),
    "probe": ("pos/best_layer", "pos/best_accuracy", "control/pos/best_accuracy", "wsd/best_accuracy"),
}  # fmt: skip
"""The summary entries the picture shows of each run (a few of those the runs table sorts by)."""


def _draw_summaries(ax, stages: list[StageRecords]) -> None:
    lines = []
    for stage in stages:
        lines.append(f"{stage.job_type} run")
        for key in SUMMARY_KEYS.get(stage.job_type, ()):
            value = stage.summary.get(key)
            if isinstance(value, float):
                lines.append(f"   {key}  {value:.3g}" if value < 10 else f"   {key}  {value:,.1f}")
            elif value is not None:
                lines.append(f"   {key}  {value:,}")
    text = "\n".join(lines)
    ax.text(0.0, 1.0, text, va="top", ha="left", family="monospace", fontsize=7.5, transform=ax.transAxes)
    ax.axis("off")
    ax.set_title("the runs' summaries (what the runs table sorts by)", fontsize=9)


def draw(root: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = {name: read_stage(root / name) for name in STAGES}
    stages = [s for s in found.values() if s is not None]
    if not stages:
        raise SystemExit(f"{root}: no offline wandb runs under {', '.join(f'{n}/wandb' for n in STAGES)}")
    figure = plt.figure(figsize=(13, 7.5))
    grid = figure.add_gridspec(2, 3, height_ratios=[1, 1.2])
    _draw_lineage(figure.add_subplot(grid[0, :]), stages)
    panels = [("train", _draw_curves), ("probe", _draw_probe)]
    for k, (name, draw_panel) in enumerate(panels):
        ax = figure.add_subplot(grid[1, k])
        if found[name] is not None:
            draw_panel(ax, found[name])
        else:
            ax.axis("off")
    _draw_summaries(figure.add_subplot(grid[1, 2]), stages)
    group = stages[0].group
    figure.suptitle(f"wandb group '{group}': {len(stages)} runs (from the offline files)", fontsize=11)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="an elmo pipeline run's folder (local)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    try:
        draw(args.root, args.out)
    except offline_reader.OfflineFileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
