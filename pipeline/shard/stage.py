"""The shard stage as a `Stage` (``pipeline/stage.py``): its work (``job.run_shard``), what it puts
on the dashboard (its totals, baselines and removed duplicates as the summary of a ``shard`` run in
the pipeline's wandb group, the output its ``dataset`` artifact) and its closing lines."""

from __future__ import annotations

from pipeline.config import to_dict
from pipeline.formats.shard_format import MANIFEST_FILE, SPLITS
from pipeline.formats.shard_manifest import ShardManifest
from pipeline.runtime import storage
from pipeline.runtime.ray_runtime import RaySession
from pipeline.shard import progress
from pipeline.shard.config import ShardConfig
from pipeline.shard.job import ShardDetails, run_shard
from pipeline.stage import Stage, StageContext, StageResult
from pipeline.tracking.artifacts import dataset_artifact
from pipeline.tracking.stage_run import StageLog


class ShardStage(Stage[ShardConfig, ShardDetails]):
    name = "shard"
    schema = ShardConfig

    def session(self, cfg: ShardConfig) -> RaySession:
        return RaySession(cfg.ray_address or None, cfg.workers or None)  # an embedded one: a CPU a task

    def run(self, cfg: ShardConfig, ctx: StageContext) -> StageResult[ShardDetails]:
        return run_shard(cfg, ctx.session)

    def dashboard(self, cfg: ShardConfig, result: StageResult[ShardDetails]) -> StageLog | None:
        """The ``shard`` run of ``result``; none for a rerun that found its output complete."""
        if not result.tokens:
            return None
        manifest = result.details.manifest
        return StageLog(
            "shard",
            to_dict(cfg),
            shard_summary(manifest, result),
            produces=dataset_artifact(manifest),
        )

    def summary(self, cfg: ShardConfig, result: StageResult[ShardDetails]) -> str:
        if not result.tokens:
            return f"shard: {result.output} is already complete ({storage.join(result.output, MANIFEST_FILE)}); nothing to do"
        details = result.details
        return progress.summary(
            details.manifest,
            result.seconds,
            reused=details.reused,
            baseline_seconds=details.baseline_seconds,
            dedup_seconds=details.dedup_seconds,
        )


SHARD = ShardStage()


def shard_summary(manifest: ShardManifest, result: StageResult[ShardDetails]) -> dict[str, float | int]:
    """The run's summary: per split its sentences, tokens and shards, and the duplicates removed;
    the vocabulary; the held-out baselines (``baselines/*``, a Kneser-Ney model per order); this
    run's seconds and tokens/s."""
    summary: dict[str, float | int] = {
        "vocab/size": manifest.vocab.size,
        "seconds": result.seconds,
        "tokens_per_s": result.tokens_per_second,
    }
    if manifest.vocab.distinct_train_tokens is not None:
        summary["vocab/distinct_train_tokens"] = manifest.vocab.distinct_train_tokens
    if manifest.lines is not None:
        summary["lines/read"] = manifest.lines.read
    for split in SPLITS:
        totals = manifest.totals[split]
        summary |= {
            f"{split}/sentences": totals.sentences,
            f"{split}/tokens": totals.tokens,
            f"{split}/unk_tokens": totals.unk_tokens,
            f"{split}/unk_rate": totals.unk_rate,
            f"{split}/shards": totals.shards,
        }
        removed = manifest.lines.duplicates.get(split) if manifest.lines is not None else None
        if removed is not None:
            summary[f"{split}/duplicate_sentences"], summary[f"{split}/duplicate_tokens"] = removed
    if manifest.unigram_perplexity is not None:
        summary["baselines/unigram_perplexity"] = manifest.unigram_perplexity
    for kneser_ney in manifest.kneser_ney:
        summary[f"baselines/kneser_ney_{kneser_ney.order}gram_perplexity"] = kneser_ney.perplexity
    return summary
