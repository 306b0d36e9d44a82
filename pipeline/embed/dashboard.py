"""What the embed stage puts on the dashboard: its totals and throughput as the summary of an
``embed`` run in the pipeline's wandb group (``pipeline/tracking/stage_run.py``)."""

from __future__ import annotations

from pipeline.config import to_dict
from pipeline.embed import manifest
from pipeline.embed.config import EmbedConfig
from pipeline.runtime import storage
from pipeline.stage_result import StageResult
from pipeline.tracking.artifacts import OutputArtifact, artifact_name
from pipeline.tracking.stage_run import StageLog


def embeddings_artifact(folder: str, document: dict) -> OutputArtifact:
    """The embed stage's output: its manifest checked, its shards listed."""
    return OutputArtifact(
        artifact_name(folder),
        "embeddings",
        checked=(manifest.manifest_path(folder),),
        listed=tuple(storage.join(folder, shard["name"]) for shard in document["shards"]),
        metadata={key: document[key] for key in ("layers", "dtype", "layout", "file_format", "pool")},
    )


def embed_log(config: EmbedConfig, result: StageResult, uses: tuple[OutputArtifact, ...]) -> StageLog:
    """The ``embed`` run of ``result``: the output's totals (sentences, tokens, shards and what was
    repaired in the input), this run's shards, tokens, seconds and tokens/s, and whether it ran to
    the end (``complete``: a run stopped with ``stop_after_shards`` is not); ``uses``: the model and
    the dataset it read; a complete output is its ``embeddings`` artifact."""
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
    produces = None
    if result.complete:
        produces = embeddings_artifact(config.output, result.details["manifest"])
    return StageLog("embed", to_dict(config), summary, uses=uses, produces=produces)
