"""What the embed stage puts on the dashboard: its totals and throughput as the summary of an
``embed`` run in the pipeline's wandb group (``pipeline/tracking/stage_run.py``)."""

from __future__ import annotations

from pipeline.config import to_dict
from pipeline.embed.config import EmbedConfig
from pipeline.stage_result import StageResult
from pipeline.tracking.stage_run import StageLog


def embed_log(config: EmbedConfig, result: StageResult) -> StageLog:
    """The ``embed`` run of ``result``: the output's totals (sentences, tokens, shards and what was
    repaired in the input), this run's shards, tokens, seconds and tokens/s, and whether it ran to
    the end (``complete``: a run stopped with ``stop_after_shards`` is not)."""
    totals = result.details["totals"]
    summary: dict[str, float | int] = {f"output/{key}": value for key, value in totals.items()}
    summary.update(
        {
            "run/shards": result.details["new_shards"],
            "run/tokens": result.tokens,
            "run/seconds": result.seconds,
            "run/tokens_per_s": result.tokens_per_second,
            "complete": int(result.complete),
        }
    )
    name = f"{config.wandb.group}-embed" if config.wandb.group else "embed"
    return StageLog("embed", name, to_dict(config), summary)
