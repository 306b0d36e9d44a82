"""What the shard stage puts on the dashboard: its totals, baselines and removed duplicates as the
summary of a ``shard`` run in the pipeline's wandb group (``pipeline/tracking/stage_run.py``)."""

from __future__ import annotations

from pipeline.config import to_dict
from pipeline.formats.shard_format import SPLITS
from pipeline.formats.unigram import manifest_unigram_perplexity
from pipeline.shard.config import ShardConfig
from pipeline.stage_result import StageResult
from pipeline.tracking.artifacts import dataset_artifact
from pipeline.tracking.stage_run import StageLog


def shard_summary(manifest: dict, result: StageResult) -> dict[str, float | int]:
    """The run's summary: per split its sentences, tokens and shards, and the duplicates removed;
    the vocabulary; the held-out baselines (``baselines/*``); this run's seconds and tokens/s."""
    summary: dict[str, float | int] = {
        "vocab/size": manifest["vocab"]["size"],
        "vocab/distinct_train_tokens": manifest["vocab"]["distinct_train_tokens"],
        "lines/read": manifest["lines"]["read"],
        "seconds": result.seconds,
        "tokens_per_s": result.tokens_per_second,
    }
    for split in SPLITS:
        totals = manifest["totals"][split]
        for key in ("sentences", "tokens", "unk_tokens", "shards"):
            summary[f"{split}/{key}"] = totals[key]
        removed = manifest["lines"].get("duplicates", {}).get(split)
        if removed is not None:
            summary[f"{split}/duplicate_sentences"] = removed["sentences"]
            summary[f"{split}/duplicate_tokens"] = removed["tokens"]
    unigram = manifest_unigram_perplexity(manifest)
    if unigram is not None:
        summary["baselines/unigram_perplexity"] = unigram
    kneser_ney = manifest["baselines"].get("kneser_ney")
    if kneser_ney is not None:
        summary["baselines/kneser_ney_perplexity"] = kneser_ney["perplexity"]
        summary["baselines/kneser_ney_order"] = kneser_ney["order"]
    return summary


def shard_log(config: ShardConfig, result: StageResult) -> StageLog:
    """The ``shard`` run of ``result`` (whose ``details["manifest"]`` is the output's), the output
    its ``dataset`` artifact."""
    manifest = result.details["manifest"]
    return StageLog(
        "shard",
        to_dict(config),
        shard_summary(manifest, result),
        produces=dataset_artifact(config.output, manifest),
    )
