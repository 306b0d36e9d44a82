"""The whole pipeline in one Ray session: shard -> train (with held-out evaluation) -> export -> embed,
then (``run_probe``) ``elmo probe`` of the trained model beside a random control.

Each stage runs as its own entry point runs it (``pipeline.stage.run_stage`` of its `Stage`); this
module only derives the paths that connect them (the model embed and probe read is the export
train's result names) and collects a closing summary. Every stage
is resumable, so rerunning a killed pipeline with the same ``storage``/``name`` picks up where it
stopped (a finished shard stage is a no-op, training resumes from its latest checkpoint, embedding
skips complete shards).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config import check_complete, to_object
from pipeline.formats.shard_format import row_baselines
from pipeline.runtime import storage
from pipeline.runtime.ray_runtime import RaySession
from pipeline.stage import STAGES, run_stage, stage_named

SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "data" / "kjv-sample.txt.gz"
"""The shipped sample corpus (a slice of the King James Version, public domain)."""


def _fill(section: DictConfig, key: str, value: Any) -> None:
    """Set ``section.key`` only when the user left it unset (MISSING, empty string or empty list)."""
    if (
        OmegaConf.is_missing(section, key)
        or section[key] in ("", None)
        or (OmegaConf.is_list(section[key]) and len(section[key]) == 0)
    ):
        section[key] = value


def derive_stage_configs(cfg: DictConfig) -> DictConfig:
    """A writable copy of ``cfg`` whose stage inputs and outputs point at each other under
    ``<storage>/<name>/``; raises ConfigError if a required key is still unset afterwards. The
    model embed and probe read, unless set, is the export training makes (`run_pipeline`)."""
    cfg = copy.deepcopy(cfg)  # the loaded config is read-only; the copy keeps its types
    OmegaConf.set_readonly(cfg, False)
    root = storage.join(storage.absolute(cfg.storage), cfg.name)
    shards, run_dir = storage.join(root, "shards"), storage.join(root, "train")
    _fill(cfg.shard, "input", list(cfg.corpus) or [str(SAMPLE_CORPUS)])
    _fill(cfg.shard, "output", shards)
    _fill(cfg.shard, "ray_address", cfg.ray_address)
    _fill(cfg.train, "shards", cfg.shard.output)
    _fill(cfg.train, "output", run_dir)
    _fill(cfg.train, "name", cfg.name)
    for stage in (cfg.shard, cfg.train, cfg.embed, cfg.probe):  # the pipeline's runs: one wandb group
        _fill(stage.wandb, "group", cfg.name)
    _fill(cfg.embed, "input", [cfg.shard.output])
    _fill(cfg.embed, "output", storage.join(root, "embeddings"))
    _fill(cfg.probe, "output", storage.join(root, "probe"))
    cfg.embed.shard_splits = [cfg.embed_split.name]
    check_complete(cfg)
    return cfg


def run_pipeline(cfg: DictConfig) -> dict[str, Any]:
    """Run every stage; returns ``{"config"}`` (the derived PipelineConfig) and each stage's
    `StageResult` under its name (``"shard"``, ``"train"``, ``"embed"``, ``"probe"``)."""
    shard, train, embed, probe = (stage_named(name) for name in STAGES)
    cfg = to_object(derive_stage_configs(cfg))  # a PipelineConfig: typed stage configs, rules checked
    results: dict[str, Any] = {"config": cfg}
    with RaySession(cfg.ray_address or None, cfg.num_cpus or None) as session:
        results["shard"] = run_stage(shard, cfg.shard, session)
        results["train"] = run_stage(train, cfg.train, session)
        cfg.embed = _reading(cfg.embed, results["train"].details.export)
        results["embed"] = run_stage(embed, cfg.embed, session)
    if cfg.run_probe:  # one process, after Ray has given its cores back
        cfg.probe = _reading(cfg.probe, results["train"].details.export)
        results["probe"] = run_stage(probe, cfg.probe)
    return results


def _reading(stage_cfg: Any, export: str) -> Any:
    """``stage_cfg`` (embed's or probe's) reading the model at ``export``, unless the user named one."""
    if stage_cfg.model or stage_cfg.options_file:
        return stage_cfg
    return dataclasses.replace(stage_cfg, model=export)


def _baseline_lines(final: dict, ppl: float) -> list[str]:
    """The biLM against each held-out baseline of its split, and the splits' ``<UNK>`` rates."""
    lines = [
        f"{label + ' baseline':<26} {value:9.2f}  -> the biLM is at {ppl / value:.1%} of it"
        for label, value in row_baselines(final)
    ]
    if any(label == "Kneser-Ney 5-gram" for label, _ in row_baselines(final)):
        lines.append("  (the paper's biLM: 59% of a Kneser-Ney 5-gram's perplexity on the 1B Word Benchmark)")
    if "eval/heldout_unk_rate" in final:
        lines.append(
            f"{'<UNK>':<26} {final['eval/train_unk_rate']:.2%} of the training tokens, "
            f"{final['eval/heldout_unk_rate']:.2%} of the held-out ones"
        )
    return lines


def _wandb_syncs(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(stage, sync command) of each stage that logged an offline wandb run this time."""
    return [
        (stage, results[stage].wandb_sync)
        for stage in STAGES
        if stage in results and results[stage].wandb_sync
    ]


def summary(results: dict[str, Any]) -> str:
    """The closing summary ``elmo pipeline`` prints."""
    cfg, details = results["config"], results["train"].details
    train = details.final
    ppl = train["eval/perplexity"]
    lines = [
        "",
        "=" * 72,
        f"elmo pipeline '{cfg.name}' finished",
        f"held-out perplexity  average {ppl:.2f}  (forward {train['eval/perplexity_fwd']:.2f}, "
        f"backward {train['eval/perplexity_bwd']:.2f})",
        *_baseline_lines(train, ppl),
        "",
        "stage   seconds   tokens/s   (train: tokens per direction, startup and evaluation included)",
    ]
    for stage in (s for s in STAGES if s != "probe"):  # the probe's figures are its table's, above
        result = results[stage]
        lines.append(f"{stage:<6} {result.seconds:8.1f} {result.tokens_per_second:10,.0f}")
    lines += [
        "",
        f"shards      {results['shard'].output}",
        f"weights     {storage.join(details.export, 'options.json')} + weights.hdf5",
        f"embeddings  {results['embed'].output}",
        f"plot        {details.plot}",
        f"metrics     {details.metrics}",
    ]
    syncs = _wandb_syncs(results)
    if syncs:
        lines += ["", f"wandb (offline, group '{cfg.train.wandb.group}'): upload each run with"]
        lines += [f"  {stage:<6} {command}" for stage, command in syncs]
    if "probe" in results:  # its table is the probe stage's closing lines, just above: printed once
        lines.append(f"probe       {results['probe'].output} (what the layers know: the table above)")
    lines.append("=" * 72)
    return "\n".join(lines)
