"""The embed stage as a `Stage` (``pipeline/stage.py``): its work (``runner.run_embed``, a row per
committed shard on the dashboard as it goes), what it puts on the dashboard once done (its totals
and throughput as the summary of an ``embed`` run in the pipeline's wandb group, the model and
dataset it read, its output's ``embeddings`` artifact) and its closing lines."""

from __future__ import annotations

from pipeline.config import to_dict
from pipeline.embed import manifest
from pipeline.embed.config import EmbedConfig, is_single_file
from pipeline.embed.runner import EmbedDetails, run_embed
from pipeline.embed.startup import summary_lines
from pipeline.formats.shard_manifest import read_manifest
from pipeline.runtime import storage
from pipeline.runtime.ray_runtime import RaySession
from pipeline.stage import Stage, StageContext, StageResult
from pipeline.tracking.artifacts import OutputArtifact, artifact_name, dataset_artifact, model_artifact
from pipeline.tracking.stage_run import StageLog


class EmbedStage(Stage[EmbedConfig, EmbedDetails]):
    name = "embed"
    schema = EmbedConfig
    system_stats = True  # the node's charts (a GPU's among them) beside the stage's curves

    def session(self, cfg: EmbedConfig) -> RaySession:
        return RaySession(cfg.ray_address or None, cfg.num_cpus or None)

    def run(self, cfg: EmbedConfig, ctx: StageContext) -> StageResult[EmbedDetails]:
        return run_embed(cfg, ctx.session, ctx.tracking)

    def tracking_folder(self, cfg: EmbedConfig) -> str | None:
        # the wandb run's files live in the output folder; a single file's parts folder is no place for them
        return None if is_single_file(cfg.output) else cfg.output

    def dashboard(self, cfg: EmbedConfig, result: StageResult[EmbedDetails]) -> StageLog | None:
        """None for a rerun that found every shard done."""
        if not result.tokens:
            return None
        details = result.details
        uses = (model_artifact(details.model.options_file, details.model.weights_file),)
        if details.input_kind == "shards":
            shards = details.input_paths[0]
            uses += (dataset_artifact(read_manifest(shards)),)
        return embed_log(cfg, result, uses)

    def summary(self, cfg: EmbedConfig, result: StageResult[EmbedDetails]) -> str:
        d = result.details
        t = d.totals
        state = (
            "complete"
            if result.complete
            else "STOPPED EARLY (stop_after_shards); rerun with the same arguments to finish"
        )
        return "\n".join(
            [
                f"embed {state}: {result.output}",
                f"  shards {d.shards} ({d.new_shards} written now), sentences {t['sentences']:,}, tokens {t['tokens']:,}",
                f"  empty sentences {t['empty_sentences']}, invalid UTF-8 lines {t['invalid_utf8_lines']}, "
                f"lines with control characters {t['control_char_lines']}, split sentences {t['split_sentences']}",
                *_records_line(d),
                f"  {result.tokens:,} tokens in {result.seconds:.1f} s = {result.tokens_per_second:,.0f} tokens/s",
                *summary_lines(d.startup, d.after_first_commit),
            ]
        )


def _records_line(details: EmbedDetails) -> list[str]:
    counts = details.records
    if counts is None:
        return []
    skipped = f", {counts.skipped:,} skipped (the first: {counts.first_skipped})" if counts.skipped else ""
    return [f"  records {counts.records:,}{skipped}; each sentence keeps its record's id and index in it"]


EMBED = EmbedStage()


def embeddings_artifact(folder: str, document: dict) -> OutputArtifact:
    """The embed stage's output: its manifest checked, its shards listed."""
    return OutputArtifact(
        artifact_name(folder),
        "embeddings",
        checked=(manifest.manifest_path(folder),),
        listed=tuple(storage.join(folder, shard["name"]) for shard in document["shards"]),
        metadata={key: document[key] for key in ("layers", "dtype", "layout", "file_format", "pool")},
    )


def embed_log(
    config: EmbedConfig, result: StageResult[EmbedDetails], uses: tuple[OutputArtifact, ...]
) -> StageLog:
    """The ``embed`` run of ``result``: the output's totals (sentences, tokens, shards and what was
    repaired in the input), this run's shards, tokens, seconds and tokens/s (and after its first
    shard, start-up apart), its start-up phases (``startup/*``), and whether it ran to the end
    (``complete``: a run stopped with ``stop_after_shards`` is not); ``uses``: the model and the
    dataset it read; a complete output is its ``embeddings`` artifact."""
    details = result.details
    summary: dict[str, float | int] = {f"output/{key}": value for key, value in details.totals.items()}
    summary.update(
        {
            "run/shards": details.new_shards,
            "run/tokens": result.tokens,
            "run/seconds": result.seconds,
            "run/tokens_per_s": result.tokens_per_second,
            "complete": int(result.complete),
        }
    )
    summary.update({f"startup/{phase}": s for phase, s in details.startup.items()})
    after = details.after_first_commit
    if after is not None and after.seconds > 0:
        summary["run/tokens_per_s_after_first_shard"] = after.tokens_per_second
    produces = None
    if result.complete:
        produces = embeddings_artifact(config.output, details.manifest)
    return StageLog("embed", to_dict(config), summary, uses=uses, produces=produces)
