"""The facts of a training run that the driver resolves once and every worker reads."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.formats.shard_manifest import ShardManifest


@dataclass(frozen=True)
class RunPlan:
    """Facts the driver resolves once and hands to every worker, as they are (frozen: no worker
    changes them).

    ``options``: the model's inference options.json dict; ``ceiling_steps``: the run's steps as its
    config asks (``run_length.ceiling_steps``; a time budget may plan fewer, and a resumed run
    continues up to its plan); ``baselines``: the held-out baselines as entries of an
    eval row (``eval/unigram_perplexity``; ``eval/kneser_ney_{N}gram_perplexity`` for each model
    the shard stage counted; ``eval/train_unk_rate`` and ``eval/heldout_unk_rate``);
    ``wandb_id``: the run's wandb id (``run.json``); ``use_gpu``: from the cluster, set (``dataclasses.replace``) just before launch."""

    run_dir: str
    name: str
    manifest: ShardManifest
    """The shard directory's manifest (``manifest.folder``: the shards, absolute)."""
    vocab_size: int
    ceiling_steps: int
    steps_per_epoch: int
    baselines: dict
    options: dict
    init_from: str
    storage_endpoint: str
    wandb_id: str
    deadline: float = 0.0
    """The ``time.time()`` by which a run with a ``time_budget`` must have ended (0: no budget;
    ``run_length.RunLength`` plans the steps that fit)."""
    use_gpu: bool = False
    lease_owner: str = ""
    """The owner token of the driver's lease on ``run_dir``, set once it holds it: every write of the
    workers checks that it still does (empty: no driver, nothing to check)."""
