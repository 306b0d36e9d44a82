"""biLM pretraining on Ray Train (V2), the driver's side: the checks, the plan and the launch.

``prepare_run`` validates the shards, vocabulary, run directory and cluster up front (one-line
``TrainError``s) and resolves the run's facts (``RunPlan``); ``run_training`` starts a
``TorchTrainer`` with ``workers`` workers: NCCL + CUDA when the cluster has GPUs, gloo on CPU.
``FailureConfig(max_failures)`` restarts the worker group when a worker dies; the workers
(``trainer.train_loop_per_worker``) then resume from the latest checkpoint in the run directory.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time

from elmo_model import BiLMOptions, OptionsError
from pipeline import shard_format, storage
from pipeline.config import UseGPU
from pipeline.model_config import to_options
from pipeline.stage_result import StageResult
from pipeline.train import checkpoint as ckpt
from pipeline.train import export as export_mod
from pipeline.train.config import TrainConfig
from pipeline.train.data import steps_per_epoch
from pipeline.train.errors import TrainError
from pipeline.train.metrics import METRICS_FILE, read_metrics
from pipeline.train.plan import RunPlan
from pipeline.train.trainer import train_loop_per_worker
from pipeline.train.unigram import heldout_unigram_perplexity

RUN_FILE = "run.json"


def _check_shards(shards: str, manifest: dict) -> None:
    for split in shard_format.SPLITS:
        entries = manifest["shards"][split]
        if not entries or manifest["totals"][split]["tokens"] <= 0:
            raise TrainError(
                f"shard directory {shards}: the manifest lists no {split} data; rerun the shard stage"
            )
        for entry in entries:
            path = storage.join(shards, entry["name"])
            if not storage.exists(path):
                raise TrainError(f"shard {path} is listed in {shard_format.MANIFEST_FILE} but missing")
            digest = storage.sha256(path)
            if digest != entry["sha256"]:
                raise TrainError(
                    f"shard {path} does not match {shard_format.MANIFEST_FILE} (sha256 {digest[:12]}..., manifest {entry['sha256'][:12]}...)"
                )


def _model_options(cfg: TrainConfig) -> dict:
    if not cfg.init_from:
        try:
            return BiLMOptions.from_dict(to_options(cfg.model)).to_dict()
        except OptionsError as err:
            raise TrainError(f"the model config: {err}") from None
    path = storage.join(cfg.init_from, export_mod.OPTIONS_FILE)
    for name in (export_mod.OPTIONS_FILE, export_mod.WEIGHTS_FILE):
        if not storage.exists(storage.join(cfg.init_from, name)):
            raise TrainError(f"init_from {cfg.init_from}: no {name} there")
    try:
        return BiLMOptions.from_dict(json.loads(storage.read_bytes(path))).to_dict()
    except json.JSONDecodeError as err:
        raise TrainError(f"init_from {path}: not valid JSON ({err})") from None
    except OptionsError as err:
        raise TrainError(f"init_from {path}: {err}") from None


def _claim_run_dir(run_dir: str, name: str) -> None:
    path = storage.join(run_dir, RUN_FILE)
    if storage.exists(path):
        owner = json.loads(storage.read_bytes(path)).get("name")
        if owner != name:
            raise TrainError(
                f"run directory {run_dir} belongs to run {owner!r}; use name={owner} to resume it or another output"
            )
        return
    if ckpt.list_checkpoints(run_dir):
        raise TrainError(
            f"run directory {run_dir} holds checkpoints but no {RUN_FILE}; choose another output"
        )
    storage.write_bytes(path, json.dumps({"name": name}).encode())


def prepare_run(cfg: TrainConfig) -> RunPlan:
    """Validate a resolved TrainConfig and resolve the run's facts (no Ray needed)."""
    if cfg.storage_endpoint:
        storage.configure(endpoint_url=cfg.storage_endpoint)
    shards = storage.absolute(cfg.shards.rstrip("/"))
    run_dir = storage.absolute(cfg.output.rstrip("/"))
    manifest = shard_format.read_manifest(shards)
    vocab = shard_format.read_vocab(shard_format.vocab_path(shards, manifest))
    if len(vocab) != manifest["vocab"]["size"]:
        raise TrainError(
            f"shard directory {shards}: vocab.txt has {len(vocab)} tokens, the manifest says {manifest['vocab']['size']}"
        )
    _check_shards(shards, manifest)
    workers, batch, unroll = cfg.workers, cfg.batch_size, cfg.unroll_steps
    per_epoch = steps_per_epoch(manifest, batch, unroll, workers)
    total = cfg.max_steps or cfg.n_epochs * per_epoch
    if total <= 0:
        raise TrainError(
            f"{manifest['totals']['train']['tokens']} training tokens are less than one global batch "
            f"(batch_size {batch} x unroll_steps {unroll} x workers {workers}); set max_steps or shrink the batch"
        )
    heldout = manifest["totals"]["heldout"]
    if heldout["tokens"] + heldout["sentences"] < cfg.eval_batch_size * workers:
        raise TrainError(
            f"the held-out split ({heldout['tokens']} tokens) cannot fill {cfg.eval_batch_size} rows on each of "
            f"{workers} workers; lower eval_batch_size"
        )
    if cfg.softmax.sampled and not 0 < cfg.softmax.negatives < len(vocab):
        raise TrainError(
            f"softmax.negatives ({cfg.softmax.negatives}) must be in [1, vocabulary size {len(vocab)}); "
            "use fewer or softmax.sampled=false"
        )
    options = _model_options(cfg)
    name = cfg.name or run_dir.rstrip("/").rsplit("/", 1)[-1]
    _claim_run_dir(run_dir, name)
    return RunPlan(
        run_dir=run_dir,
        name=name,
        shards=shards,
        manifest=manifest,
        vocab_size=len(vocab),
        total_steps=total,
        steps_per_epoch=per_epoch,
        unigram_perplexity=float(heldout_unigram_perplexity(shards, manifest)),
        options=options,
        init_from=storage.absolute(cfg.init_from),
        storage_endpoint=cfg.storage_endpoint,
    )


CLUSTER_QUERY_TIMEOUT_S = 60.0


def _cluster_resources() -> dict:
    """``ray.cluster_resources()``, asked on a helper thread: its GCS query has no timeout of its own,
    and a stalled answer should not stall the run (Ray Train waits for resources anyway)."""
    import threading

    import ray

    answer: dict = {}
    query = threading.Thread(target=lambda: answer.update(ray.cluster_resources()), daemon=True)
    query.start()
    query.join(CLUSTER_QUERY_TIMEOUT_S)
    if query.is_alive():
        raise TrainError(f"the Ray cluster did not report its resources within {CLUSTER_QUERY_TIMEOUT_S:g} s")
    return answer


def _cluster_check(cfg: TrainConfig) -> bool:
    """Whether to use GPUs; a TrainError when the cluster cannot hold the workers."""
    resources = _cluster_resources()
    workers, threads = cfg.workers, cfg.threads_per_worker
    gpus = resources.get("GPU", 0)
    use_gpu = {UseGPU.auto: gpus >= 1, UseGPU.true: True, UseGPU.false: False}[cfg.use_gpu]
    if use_gpu and gpus < workers:
        raise TrainError(f"workers={workers} need {workers} GPUs but the Ray cluster has {gpus:g}")
    cpus = resources.get("CPU", 0)
    need = workers * (1 if use_gpu else threads)
    if cpus < need:
        raise TrainError(
            f"workers={workers} x threads_per_worker={threads} need {need} CPUs but the Ray cluster has {cpus:g}; "
            "lower workers or threads_per_worker"
        )
    return use_gpu


def _failure_message(err: BaseException) -> str:
    failures = getattr(err, "worker_failures", None) or {}
    for failure in failures.values():
        lines = [line for line in str(failure).strip().splitlines() if line.strip()]
        if lines:
            return lines[-1].strip()
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(err).__name__


def run_training(cfg: TrainConfig, plan: RunPlan | None = None) -> StageResult:
    """Run (or resume) a training run; Ray must be initialised. ``plan``: from ``prepare_run(cfg)``
    (computed here when None). The result's ``details`` are the final status row (end-of-run
    held-out perplexities); its tokens are this run's positions of one direction (a resumed run
    counts only the steps it ran)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchConfig, TorchTrainer

    plan = prepare_run(cfg) if plan is None else plan
    plan.use_gpu = _cluster_check(cfg)
    started, steps_before = time.perf_counter(), _logged_steps(plan.run_dir)
    ray_storage = tempfile.mkdtemp(prefix="elmo-ray-train-")
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg, "plan": dataclasses.asdict(plan)},
        torch_config=TorchConfig(backend="nccl" if plan.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=cfg.workers,
            use_gpu=plan.use_gpu,
            resources_per_worker=None if plan.use_gpu else {"CPU": cfg.threads_per_worker},
        ),
        run_config=RunConfig(
            name=plan.name,
            storage_path=ray_storage,
            failure_config=FailureConfig(max_failures=cfg.max_failures),
        ),
    )
    try:
        trainer.fit()
    except TrainingFailedError as err:  # surface the worker's own last line, not Ray's traceback
        raise TrainError(f"training failed: {_failure_message(err)}") from None
    finally:
        shutil.rmtree(ray_storage, ignore_errors=True)
    final = final_status(plan.run_dir)
    steps = int(final["step"]) - steps_before
    tokens = steps * cfg.batch_size * cfg.unroll_steps * cfg.workers
    return StageResult("train", plan.run_dir, time.perf_counter() - started, tokens, details=final)


def _logged_steps(run_dir: str) -> int:
    """Steps an earlier (resumed) run already logged, so this run's tokens count only its own."""
    path = storage.join(run_dir, METRICS_FILE)
    if not storage.exists(path):
        return 0
    return max(
        (int(row.get("step", 0)) for row in read_metrics(path) if row.get("kind") == "train"), default=0
    )


def final_status(run_dir: str) -> dict:
    """The last ``status`` row rank 0 wrote to metrics.jsonl; a TrainError unless it says ``done``."""
    path = storage.join(run_dir, METRICS_FILE)
    rows = [r for r in read_metrics(path) if r.get("kind") == "status"] if storage.exists(path) else []
    if not rows:
        raise TrainError(f"training ended without a final status in {path}")
    if rows[-1].get("status") != "done":
        raise TrainError(str(rows[-1].get("message", "training stopped")))
    return rows[-1]


__all__ = ["TrainError", "RunPlan", "prepare_run", "run_training", "final_status"]
