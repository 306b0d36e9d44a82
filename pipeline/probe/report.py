"""What a probe says, three ways: a console table, ``probe.json`` and ``probe.png``.

``probe.json``: ``{"model": {...}, "probes": {"pos": {"layers": {"0", "1", "2", "mix"}, "baseline",
"train", "test"}, "wsd": {"layers": {"0", "1", "2"}, "baseline", "test"}}, "control": {the same for
a randomly initialised model of the same size, when asked}, "set": {...}, "seconds": s}``;
accuracies in [0, 1].
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict

from pipeline.probe.pos_probe import PosResult
from pipeline.probe.wsd_probe import WsdResult
from pipeline.runtime import storage

JSON_FILE = "probe.json"
PLOT_FILE = "probe.png"


def probes(pos: PosResult, wsd: WsdResult) -> dict:
    return {"pos": asdict(pos), "wsd": asdict(wsd)}


TASKS = {"pos": "part of speech", "wsd": "word sense"}


def runs(result: dict) -> list[tuple[str, dict]]:
    """``(label, probes)`` of the model, then of the random control where the result has one."""
    return [("model", result["probes"])] + (
        [("random control", result["control"])] if "control" in result else []
    )


def _layers(result: dict) -> list:
    """The layers' keys in the table's order: the numbered layers, then the mix."""
    return sorted(result["probes"]["pos"]["layers"], key=lambda k: (k == "mix", str(k)))


def table(result: dict) -> str:
    """Layers x probes with the baselines; ``*`` marks each probe's best layer (the mix aside)."""
    rows = runs(result)
    layers = _layers(result)
    width = max(len(f"{title} ({label})") for title in TASKS.values() for label, _ in rows) + 2
    header = f"{'probe':<{width}}" + "".join(f"{'layer ' + k if k != 'mix' else 'mix':>10}" for k in layers)
    lines = [header + f"{'baseline':>10}"]
    for label, found in rows:
        for name, title in TASKS.items():
            accuracy = found[name]["layers"]
            numbered = {k: v for k, v in accuracy.items() if k != "mix"}
            best = max(numbered, key=numbered.get)
            cells = "".join(
                f"{(f'{100 * accuracy[k]:.1f}' + ('*' if k == best else ' ')) if k in accuracy else '':>10}"
                for k in layers
            )
            lines.append(
                f"{title + ' (' + label + ')':<{width}}{cells}{100 * found[name]['baseline']:>9.1f} "
            )
    pos, wsd = result["probes"]["pos"], result["probes"]["wsd"]
    lines.append(
        f"accuracy in %; part of speech: {pos['train']:,} training and {pos['test']:,} test tokens of Brown; "
        f"word sense: {wsd['test']:,} WordNet examples, nearest sense, leave one out; * = best layer"
    )
    return "\n".join(lines)


def table_rows(result: dict) -> tuple[list[str], list[list]]:
    """The table as columns and rows, for a dashboard's table (``wandb.Table``): a row per probe
    (and per random-control probe), its accuracy at each layer and the mix (None where a probe has
    no mix), and its baseline; accuracies as fractions."""
    layers = _layers(result)
    columns = ["probe", *(f"layer {k}" if k != "mix" else "mix" for k in layers), "baseline"]
    rows = [
        [f"{title} ({label})", *(found[name]["layers"].get(k) for k in layers), found[name]["baseline"]]
        for label, found in runs(result)
        for name, title in TASKS.items()
    ]
    return columns, rows


def plot(result: dict) -> bytes:
    """A bar chart per probe: each layer's accuracy (and the random control's beside it), the
    baseline as a dashed line. Drawn on a ``Figure`` of its own, not pyplot's shared state: a
    training run's live probe draws it in a thread beside the steps."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 3.6))
    axes = figure.subplots(1, 2)
    for ax, (name, title) in zip(
        axes, (("pos", "part of speech (linear)"), ("wsd", "word sense (nearest sense)")), strict=True
    ):
        found = result["probes"][name]
        keys = sorted(found["layers"], key=lambda k: (k == "mix", k))
        positions = range(len(keys))
        width = 0.38 if "control" in result else 0.7
        ax.bar(
            [p - (width / 2 if "control" in result else 0) for p in positions],
            [100 * found["layers"][k] for k in keys],
            width,
            label="model",
        )
        if "control" in result:
            control = result["control"][name]["layers"]
            ax.bar(
                [p + width / 2 for p in positions],
                [100 * control[k] for k in keys],
                width,
                color="lightgray",
                hatch="//",
                label="random control",
            )
        ax.axhline(100 * found["baseline"], color="black", linestyle="--", linewidth=1, label="baseline")
        ax.set_xticks(list(positions), [f"layer {k}" if k != "mix" else "mix" for k in keys])
        ax.set_ylim(0, 100)
        ax.set_ylabel("accuracy (%)")
        ax.set_title(title)
    axes[0].legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def write(output: str, result: dict) -> tuple[str, str]:
    """``probe.json`` and ``probe.png`` into ``output`` (after the runner's marker)."""
    json_path, png_path = storage.join(output, JSON_FILE), storage.join(output, PLOT_FILE)
    storage.write_bytes(json_path, (json.dumps(result, indent=2) + "\n").encode("utf-8"))
    storage.write_bytes(png_path, plot(result))
    return json_path, png_path
