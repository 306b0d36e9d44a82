"""biLM pretraining on Ray Train (V2), the driver's side: the checks, the plan and the launch.

``prepare_run`` validates the shards, vocabulary, run directory and cluster up front (one-line
``TrainError``s) and resolves the run's facts (``RunPlan``); ``run_training`` starts a
``TorchTrainer`` with ``workers`` workers: NCCL + CUDA when the cluster has GPUs, gloo on CPU.
When a worker is lost (its process died, its node went away, a collective broke with it) the run is
started again, up to ``max_failures`` times, and the workers (``trainer.train_loop_per_worker``)
resume from the latest checkpoint in the run directory. An error the run's own code raised about
its input or settings is never retried: the same input would fail the same way.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass

import ray

from elmo_model import BiLMOptions, OptionsError
from pipeline.config import UseGPU
from pipeline.formats import shard_format
from pipeline.formats.shard_format import UNIGRAM_METRIC, kneser_ney_metric
from pipeline.formats.shard_manifest import ShardManifest, read_manifest
from pipeline.formats.unigram import heldout_unigram_perplexity
from pipeline.model_config import to_options
from pipeline.model_loader import check_files, read_options
from pipeline.output_folder import taken_back_on_failure
from pipeline.runtime import cluster_capacity, ray_runtime, storage
from pipeline.runtime.ray_runtime import RaySession
from pipeline.runtime.stopping import stop_error
from pipeline.stage import StageResult
from pipeline.tracking.config import WandbMode
from pipeline.tracking.offline_files import sync_command
from pipeline.train import export as export_mod
from pipeline.train import run_length
from pipeline.train.config import NAME_RULE, TrainConfig, run_name_ok
from pipeline.train.errors import TrainError
from pipeline.train.evaluate import check_heldout_split
from pipeline.train.fit import fit_with_restarts
from pipeline.train.metrics import read_metrics, repair_metrics
from pipeline.train.plan import RunPlan
from pipeline.train.progress import RelayFollower, relay_actor
from pipeline.train.run_claim import claim_run_dir, data_identity, run_lease
from pipeline.train.run_dir import OWN_FILES, RunDir


def _check_shards(shards: str, manifest: ShardManifest) -> None:
    """Every split has data and every listed shard exists: one listing of the shard directory (a few
    requests on S3 however many shards). The shards' bytes are not read here: each worker checks a
    shard's sha256 as it streams it (``shard_reading.read_shard_sentences``), so a launch or resume
    costs the same at 10M tokens as at a billion."""
    for split in shard_format.SPLITS:
        if not manifest.shards[split] or manifest.totals[split].tokens <= 0:
            raise TrainError(
                f"shard directory {shards}: the manifest lists no {split} data; {_no_split_advice(split, manifest)}"
            )
    manifest.check_listed_shards()


def _no_split_advice(split: str, manifest: ShardManifest) -> str:
    """What makes a split that a shard output lacks: a rerun into the same output would give the
    same shards, so the advice names the settings that change them."""
    if split == "heldout":
        fraction = manifest.settings.heldout_fraction
        return (
            f"it was sharded with heldout_fraction={'?' if fraction is None else fraction} and no "
            "heldout_input; shard the corpus into a new output with heldout_fraction=0.01 or a heldout_input"
        )
    return "the shard stage kept no training sentence from its input; check its inputs and their line accounting in manifest.json"


def _model_options(cfg: TrainConfig) -> dict:
    if not cfg.init_from:
        try:
            return BiLMOptions.from_dict(to_options(cfg.model)).to_dict()
        except OptionsError as err:
            raise TrainError(f"the model config: {err}") from None
    options_path, weights_path = export_mod.export_files(cfg.init_from)
    try:  # the model loader's checks, as embed and probe read a model folder
        check_files(options_path, weights_path, cfg.init_from, TrainError)
        return read_options(options_path, TrainError).to_dict()
    except TrainError as err:
        raise TrainError(f"init_from: {err}") from None


GPU_MEMORY_BOUND = 256 * 2**30
"""More memory than any one GPU has: a step that needs more cannot run on a GPU either."""


def check_step_fits(cfg: TrainConfig, options: dict, use_gpu: bool) -> None:
    """Refuse, before Ray starts, a step no worker can hold: its LSTM gates alone (kept for the
    backward pass: N layers x 2 directions x 4C per position, in bfloat16 at best) against this
    machine's memory (CPU workers share it) or, for GPUs, more than any GPU has."""
    lstm = options["lstm"]
    positions = cfg.batch_size * cfg.unroll_steps
    per_position = lstm["n_layers"] * 2 * 4 * lstm["dim"] * 2
    need = positions * per_position * (1 if use_gpu else cfg.workers)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    bound = max(host, GPU_MEMORY_BOUND) if use_gpu else host
    if need > bound:
        raise TrainError(
            f"batch_size x unroll_steps = {positions:,} positions a step need at least {need / 2**30:,.0f} GiB "
            f"(the LSTM gates a step keeps, {per_position:,} bytes a position"
            f"{'' if use_gpu else f', {cfg.workers} workers'}); the most a worker here can "
            f"have is {bound / 2**30:,.0f} GiB: lower batch_size or unroll_steps"
        )


def gpus_possible(cfg: TrainConfig) -> bool:
    """Before Ray starts: whether the run may train on GPUs. ``auto`` on a machine without one
    trains on its CPUs unless it joins a cluster (``ray_address`` or ``RAY_ADDRESS``), whose
    nodes are only known once it is joined (``_cluster_check`` sizes the step again then)."""
    if cfg.use_gpu is not UseGPU.auto:
        return cfg.use_gpu is UseGPU.true
    import torch

    return torch.cuda.is_available() or bool(cfg.ray_address or os.environ.get("RAY_ADDRESS"))


def prepare_run(cfg: TrainConfig) -> RunPlan:
    """Validate a resolved TrainConfig and resolve the run's facts (no Ray needed)."""
    if cfg.storage_endpoint:
        storage.configure(endpoint_url=cfg.storage_endpoint)
    shards = storage.absolute(cfg.shards.rstrip("/"))
    run_dir = storage.absolute(cfg.output.rstrip("/"))
    manifest = read_manifest(shards)
    _, vocab = manifest.read_vocab()
    if len(vocab) != manifest.vocab.size:
        raise TrainError(
            f"shard directory {shards}: vocab.txt has {len(vocab)} tokens, the manifest says {manifest.vocab.size}"
        )
    _check_shards(shards, manifest)
    baselines = _baselines(manifest)
    workers, batch, unroll = cfg.workers, cfg.batch_size, cfg.unroll_steps
    ceiling, per_epoch = run_length.ceiling_steps(cfg, manifest)
    if ceiling <= 0:
        raise TrainError(
            f"{manifest.totals['train'].tokens} training tokens are less than one global batch "
            f"(batch_size {batch} x unroll_steps {unroll} x workers {workers}); set max_steps or shrink the batch"
        )
    check_heldout_split([e.sentences for e in manifest.shards["heldout"]], cfg.eval_batch_size, workers)
    if cfg.softmax.sampled and not 0 < cfg.softmax.negatives < len(vocab):
        raise TrainError(
            f"softmax.negatives ({cfg.softmax.negatives}) must be in [1, vocabulary size {len(vocab)}); "
            "use fewer or softmax.sampled=false"
        )
    options = _model_options(cfg)
    check_step_fits(cfg, options, gpus_possible(cfg))
    name = cfg.name or run_dir.rstrip("/").rsplit("/", 1)[-1]
    if not run_name_ok(name):
        raise TrainError(f"run name {name!r} (the output folder's name) is not {NAME_RULE}: set name=...")
    run_lease(run_dir).check()  # another live run in this directory: refused before anything is written
    wandb_id = claim_run_dir(run_dir, name, data_identity(manifest))
    return RunPlan(
        run_dir=run_dir,
        name=name,
        manifest=manifest,
        vocab_size=len(vocab),
        ceiling_steps=ceiling,
        steps_per_epoch=per_epoch,
        baselines=baselines,
        options=options,
        init_from=storage.absolute(cfg.init_from),
        storage_endpoint=cfg.storage_endpoint,
        wandb_id=wandb_id,
        deadline=run_length.deadline(cfg, time.time()),
    )


def _baselines(manifest: ShardManifest) -> dict:
    """RunPlan.baselines: the unigram's, the shard stage's Kneser-Ney models where it counted them,
    and each split's ``<UNK>`` rate. Shards whose ``<UNK>`` cannot be learned get a one-line
    warning, not a refusal: their held-out perplexity is still measured, only pessimistic by the
    untrained row (docs/training.md#the-vocabulary)."""
    baselines = {UNIGRAM_METRIC: float(heldout_unigram_perplexity(manifest))}
    for kneser_ney in manifest.kneser_ney:
        baselines[kneser_ney_metric(kneser_ney.order)] = kneser_ney.perplexity
    for split in shard_format.SPLITS:
        baselines[f"eval/{split}_unk_rate"] = manifest.totals[split].unk_rate
    warning = manifest.unlearnable_unk()
    if warning:
        print(f"{warning.replace('warning: ', f'warning: shards {manifest.folder}: ', 1)}", file=sys.stderr)
    return baselines


def _cluster_check(cfg: TrainConfig, embedded: bool | None = None) -> bool:
    """Whether to use GPUs, once the cluster holds the workers (an autoscaling cluster is asked for
    them, see ``pipeline.runtime.cluster_capacity``); a TrainError when it cannot. ``embedded``: the
    cluster never grows (default: whether this process started it)."""
    embedded = ray_runtime.embedded() if embedded is None else embedded
    try:
        gpus = cluster_capacity.gpus_to_be_had(embedded) if cfg.use_gpu is UseGPU.auto else 0
        use_gpu = {UseGPU.auto: gpus >= 1, UseGPU.true: True, UseGPU.false: False}[cfg.use_gpu]
        workers, threads = cfg.workers, cfg.threads_per_worker
        if use_gpu:
            bundles = ({"GPU": 1.0, "CPU": 1.0},) * workers
            what, hint = f"workers={workers}", "lower workers"
        else:
            bundles = ({"CPU": float(threads)},) * workers
            what, hint = (
                f"workers={workers} x threads_per_worker={threads}",
                "lower workers or threads_per_worker",
            )
        need = cluster_capacity.Need(bundles, what, hint)
        cluster_capacity.secure(need, embedded, cfg.resources_timeout_s)
    except cluster_capacity.CapacityError as err:
        raise TrainError(str(err)) from None
    return use_gpu


@dataclass(frozen=True)
class TrainDetails:
    """What a training run leaves beyond the counts every stage gives: its final row and where a
    later stage (embed, probe) and a user find its results."""

    final: dict
    """The run's final status row of ``metrics.jsonl`` (the end-of-run held-out perplexities under
    their metric names, ``eval/perplexity`` ..., the baselines and ``<UNK>`` rates of its split)."""
    export: str
    """The exported model's folder (``options.json`` + ``weights.hdf5``)."""
    plot: str
    """``perplexity.png``."""
    metrics: str
    """``metrics.jsonl``."""


def run_training(
    cfg: TrainConfig, plan: RunPlan | None = None, session: RaySession | None = None
) -> StageResult[TrainDetails]:
    """Run (or resume) a training run in the entry point's Ray ``session`` (default: the Ray this
    process initialised). ``plan``: from ``prepare_run(cfg)`` (computed here when None). Its
    tokens are this run's positions of one direction (a resumed run counts only the steps it ran)."""
    plan = prepare_run(cfg) if plan is None else plan
    with taken_back_on_failure(plan.run_dir, OWN_FILES):  # a run that wrote nothing does not hold the folder
        (session or RaySession.joined()).start()
        plan = dataclasses.replace(plan, use_gpu=_cluster_check(cfg))
        check_step_fits(cfg, plan.options, plan.use_gpu)  # the cluster's devices now known
        started = time.perf_counter()
        relay = relay_actor()
        try:
            with run_lease(plan.run_dir) as lease:
                plan = dataclasses.replace(plan, lease_owner=lease.owner)  # every write checks it
                steps_before = _logged_steps(plan.run_dir)
                with RelayFollower(relay, plan.ceiling_steps, from_step=steps_before) as follower:
                    stopped_by = fit_with_restarts(cfg, plan, relay)
        finally:
            ray.kill(relay)
    final = final_status(follower.status, stopped_by)
    if stopped_by is not None:  # the stop came at the last step: the run finished within its grace period
        print(
            f"{signal.Signals(stopped_by).name} came at the run's last step: it finished, evaluated and "
            "exported within the grace period",
            file=sys.stderr,
        )
    run_dir = RunDir(plan.run_dir)
    sync = None
    if cfg.wandb.mode is WandbMode.offline:  # rank 0 logged the run as it went, into the run directory
        # (the stage logs no run of its own: the result carries this one's sync command)
        sync = sync_command(run_dir.wandb, plan.wandb_id, cfg.wandb.project, cfg.wandb.entity)
    tokens = (int(final["step"]) - steps_before) * cfg.tokens_per_step(cfg.workers)
    details = TrainDetails(final, run_dir.export, run_dir.plot, run_dir.metrics)
    return StageResult("train", plan.run_dir, time.perf_counter() - started, tokens, details, wandb_sync=sync)


def _logged_steps(run_dir: str) -> int:
    """Steps an earlier (resumed) run already logged, so this run's tokens count only its own. A
    record torn by a kill is dropped from metrics.jsonl first (one line of warning), so that the
    workers read a whole file."""
    path = RunDir(run_dir).metrics
    warning = repair_metrics(path)
    if warning:
        print(warning, file=sys.stderr)
    if not storage.exists(path):
        return 0
    return max(
        (int(row.get("step", 0)) for row in read_metrics(path) if row.get("kind") == "train"), default=0
    )


def final_status(status: dict | None, stopped_by: int | None = None) -> dict:
    """The run's final status row, as rank 0 handed it to the driver; a TrainError unless it says
    ``done``, and for a run stopped by signal ``stopped_by`` the `Terminated` (SIGTERM) or
    KeyboardInterrupt that says where it stopped. (Not Ray Train's ``Result.metrics``: Ray Train
    V2 keeps only metrics reported with a checkpoint, and its checkpoint storage would need a path
    every node shares.)"""
    if stopped_by is not None and (not status or status.get("status") != "done"):
        stopped = status is not None and status.get("status") == "stopped"
        raise stop_error(stopped_by, status["message"] if stopped else "")
    if not status or "status" not in status:
        raise TrainError("training ended without a final status")
    if status["status"] != "done":
        raise TrainError(str(status.get("message", "training stopped")))
    return status


__all__ = ["TrainError", "TrainDetails", "RunPlan", "prepare_run", "run_training", "final_status"]
