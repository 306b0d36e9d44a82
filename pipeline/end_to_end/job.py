"""The whole pipeline in one Ray session: shard -> train (with held-out evaluation) -> export -> embed,
then (``run_probe``) ``elmo probe`` of the trained model beside a random control.

Each stage is the same function its own job runs (``run_shard``, ``run_training``, ``run_embed``);
this module only derives the paths that connect them and collects a closing summary. Every stage
is resumable, so rerunning a killed pipeline with the same ``storage``/``name`` picks up where it
stopped (a finished shard stage is a no-op, training resumes from its latest checkpoint, embedding
skips complete shards).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config import check_complete, to_object
from pipeline.runtime import storage
from pipeline.runtime.ray_runtime import RaySession
from pipeline.train.run_dir import RunDir

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
    ``<storage>/<name>/``; raises ConfigError if a required key is still unset afterwards."""
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
    _fill(cfg.embed, "model", RunDir(cfg.train.output).export)
    _fill(cfg.embed, "input", [cfg.shard.output])
    _fill(cfg.embed, "output", storage.join(root, "embeddings"))
    _fill(cfg.probe, "model", RunDir(cfg.train.output).export)
    _fill(cfg.probe, "output", storage.join(root, "probe"))
    cfg.embed.shard_splits = [cfg.embed_split.name]
    check_complete(cfg)
    return cfg


def run_pipeline(cfg: DictConfig) -> dict[str, Any]:
    """Run every stage; returns ``{"config"}`` (the derived PipelineConfig) and each stage's
    `StageResult` under ``"shard"``, ``"train"``, ``"embed"``."""
    from pipeline.embed.runner import run_embed
    from pipeline.shard.job import run_shard
    from pipeline.train.launch import run_training

    cfg = to_object(derive_stage_configs(cfg))  # a PipelineConfig: typed stage configs, rules checked
    results: dict[str, Any] = {"config": cfg}
    with RaySession(cfg.ray_address or None, cfg.num_cpus or None) as session:
        results["shard"] = run_shard(cfg.shard, session)
        results["train"] = run_training(cfg.train, session=session)
        results["embed"] = run_embed(cfg.embed, session)
    if cfg.run_probe:  # one process, after Ray has given its cores back
        from pipeline.probe.runner import run_probe

        results["probe"] = run_probe(cfg.probe)
    return results


def _kneser_ney_line(final: dict, ppl: float) -> list[str]:
    if "eval/kneser_ney_perplexity" not in final:
        return []
    kn = final["eval/kneser_ney_perplexity"]
    label = f"Kneser-Ney {final['eval/kneser_ney_order']}-gram"
    return [
        f"{label:<20} {kn:.2f}  -> the biLM is at {ppl / kn:.1%} of it (the paper's biLM: 59% of a 5-gram's)"
    ]


def _wandb_syncs(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(stage, sync command) of each stage that logged an offline wandb run this time."""
    syncs = []
    for stage in ("shard", "train", "embed", "probe"):
        details = results.get(stage)
        details = getattr(details, "details", details) or {}
        if details.get("wandb_sync"):
            syncs.append((stage, details["wandb_sync"]))
    return syncs


def summary(results: dict[str, Any]) -> str:
    """The closing summary ``elmo pipeline`` prints."""
    cfg, train = results["config"], results["train"].details
    run_dir = RunDir(cfg.train.output)
    ppl, unigram = train["eval/perplexity"], train["eval/unigram_perplexity"]
    lines = [
        "",
        "=" * 72,
        f"elmo pipeline '{cfg.name}' finished",
        f"held-out perplexity  average {ppl:.2f}  (forward {train['eval/perplexity_fwd']:.2f}, "
        f"backward {train['eval/perplexity_bwd']:.2f})",
        f"unigram baseline     {unigram:.2f}  -> the biLM is at {ppl / unigram:.1%} of the baseline",
        *_kneser_ney_line(train, ppl),
        "",
        "stage   seconds   tokens/s   (train: tokens per direction, startup and evaluation included)",
    ]
    for stage in ("shard", "train", "embed"):
        result = results[stage]
        lines.append(f"{stage:<6} {result.seconds:8.1f} {result.tokens_per_second:10,.0f}")
    lines += [
        "",
        f"shards      {results['shard'].output}",
        f"weights     {storage.join(run_dir.export, 'options.json')} + weights.hdf5",
        f"embeddings  {results['embed'].output}",
        f"plot        {run_dir.plot}",
        f"metrics     {run_dir.metrics}",
    ]
    syncs = _wandb_syncs(results)
    if syncs:
        lines += ["", f"wandb (offline, group '{cfg.train.wandb.group}'): upload each run with"]
        lines += [f"  {stage:<6} {command}" for stage, command in syncs]
    if "probe" in results:
        from pipeline.probe.report import table

        probe = results["probe"]
        lines += [
            "",
            f"what the layers know ({probe['seconds']:.0f} s; {', '.join(probe['written'])}):",
            table(probe),
        ]
    lines.append("=" * 72)
    return "\n".join(lines)
