"""The whole pipeline in one Ray session: shard -> train (with held-out evaluation) -> export -> embed.

Each stage is the same function its own job runs (``run_shard``, ``run_training``, ``run_embed``);
this module only derives the paths that connect them and collects a closing summary. Every stage
is resumable, so rerunning a killed pipeline with the same ``storage``/``name`` picks up where it
stopped (a finished shard stage is a no-op, training resumes from its latest checkpoint, embedding
skips complete shards).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline import storage
from pipeline.config import check_complete
from pipeline.ray_runtime import ray_session

SAMPLE_CORPUS = Path(__file__).resolve().parent / "data" / "kjv-sample.txt.gz"
"""The shipped sample corpus (a slice of the King James Version, public domain)."""


@dataclass
class StageReport:
    """What one stage did: seconds, tokens processed and a few named results."""

    seconds: float
    tokens: int
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


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
    root = storage.join(storage.absolute(str(cfg.storage)), str(cfg.name))
    shards, run_dir = storage.join(root, "shards"), storage.join(root, "train")
    _fill(cfg.shard, "input", list(cfg.corpus) or [str(SAMPLE_CORPUS)])
    _fill(cfg.shard, "output", shards)
    _fill(cfg.shard, "ray_address", str(cfg.ray_address))
    _fill(cfg.train, "shards", str(cfg.shard.output))
    _fill(cfg.train, "output", run_dir)
    _fill(cfg.train, "name", str(cfg.name))
    _fill(cfg.embed, "model", storage.join(str(cfg.train.output), "export"))
    _fill(cfg.embed, "input", [str(cfg.shard.output)])
    _fill(cfg.embed, "output", storage.join(root, "embeddings"))
    cfg.embed.shard_splits = [str(cfg.embed_split)]
    check_complete(cfg)
    return cfg


def _trained_steps(run_dir: str) -> int:
    """Steps an earlier (resumed) run already logged, so this run's tokens/s counts only its own."""
    from pipeline.train.metrics import METRICS_FILE, read_metrics

    path = storage.join(run_dir, METRICS_FILE)
    if not storage.exists(path):
        return 0
    return max(
        (int(row.get("step", 0)) for row in read_metrics(path) if row.get("kind") == "train"), default=0
    )


def run_pipeline(cfg: DictConfig) -> dict[str, Any]:
    """Run every stage; returns ``{"config", "shard", "train", "embed"}`` (StageReports + config)."""
    from pipeline.embed.runner import run_embed
    from pipeline.shard.job import run_shard
    from pipeline.train.launch import run_training

    cfg = derive_stage_configs(cfg)
    reports: dict[str, Any] = {"config": cfg}
    with ray_session(str(cfg.ray_address) or None, int(cfg.num_cpus) or None):
        start = time.monotonic()
        manifest = run_shard(cfg.shard)
        totals = manifest["totals"]
        reports["shard"] = StageReport(
            time.monotonic() - start,
            totals["train"]["tokens"] + totals["heldout"]["tokens"],
            {"output": str(cfg.shard.output), "vocab_size": manifest["vocab"]["size"]},
        )

        start, steps_before = time.monotonic(), _trained_steps(str(cfg.train.output))
        final = run_training(cfg.train)
        tokens_per_step = int(cfg.train.batch_size) * int(cfg.train.unroll_steps) * int(cfg.train.workers)
        steps = int(final["step"]) - steps_before
        reports["train"] = StageReport(time.monotonic() - start, steps * tokens_per_step, final)

        start = time.monotonic()
        result = run_embed(cfg.embed)
        reports["embed"] = StageReport(time.monotonic() - start, result.new_tokens, {"output": result.output})
    return reports


def summary(reports: dict[str, Any]) -> str:
    """The closing summary ``elmo pipeline`` prints."""
    cfg, train = reports["config"], reports["train"].details
    run_dir = str(cfg.train.output)
    ppl, unigram = train["eval/perplexity"], train["eval/unigram_perplexity"]
    lines = [
        "",
        "=" * 72,
        f"elmo pipeline '{cfg.name}' finished",
        f"held-out perplexity  average {ppl:.2f}  (forward {train['eval/perplexity_fwd']:.2f}, "
        f"backward {train['eval/perplexity_bwd']:.2f})",
        f"unigram baseline     {unigram:.2f}  -> the biLM is at {ppl / unigram:.1%} of the baseline",
        "",
        "stage   seconds   tokens/s   (train: tokens per direction, startup and evaluation included)",
    ]
    for stage in ("shard", "train", "embed"):
        report = reports[stage]
        lines.append(f"{stage:<6} {report.seconds:8.1f} {report.tokens_per_second:10,.0f}")
    lines += [
        "",
        f"shards      {reports['shard'].details['output']}",
        f"weights     {storage.join(run_dir, 'export', 'options.json')} + weights.hdf5",
        f"embeddings  {reports['embed'].details['output']}",
        f"wandb run   {train.get('wandb_dir', storage.join(run_dir, 'wandb'))} (offline; `wandb sync` uploads it)",
        f"plot        {storage.join(run_dir, 'perplexity.png')}",
        f"metrics     {storage.join(run_dir, 'metrics.jsonl')}",
        "=" * 72,
    ]
    return "\n".join(lines)
