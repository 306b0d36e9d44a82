"""biLM pretraining on Ray Train (V2): the driver's checks and launch, and the per-worker loop.

Driver (``run_training``): validates the shards, vocabulary, run directory and cluster up front
(one-line ``TrainError``s), then starts a ``TorchTrainer`` with ``workers`` workers: NCCL + CUDA
when the cluster has GPUs, gloo on CPU. ``FailureConfig(max_failures)`` restarts the worker group
when a worker dies; the loop then resumes from the latest checkpoint in the run directory.

Worker (``train_loop_per_worker``): one DDP rank. The token encoder and LSTM are under DDP; the
softmax is not (its gradient travels as touched rows, see ``softmax_exchange``). Every rank runs
the same number of steps, because the row streams never run dry (``data``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from elmo_model import BiLM, BiLMOptions
from pipeline import storage
from pipeline.config import require_at_least, require_choice, to_dict
from pipeline.model_config import to_options
from pipeline.ray_runtime import worker_env
from pipeline.shard import format as shard_format
from pipeline.train import checkpoint as ckpt
from pipeline.train import export as export_mod
from pipeline.train.char_cache import CharCache
from pipeline.train.data import open_lm_batches, steps_per_epoch
from pipeline.train.evaluate import EVAL_UNROLL_STEPS, HeldoutSums, heldout_sums
from pipeline.train.metrics import (
    METRICS_FILE,
    PLOT_FILE,
    WANDB_MODES,
    MetricsLog,
    WandbSink,
    measure_matmul_peak,
    perplexity,
    plot_perplexity,
    read_metrics,
)
from pipeline.train.objective import SharedSoftmax
from pipeline.train.optimization import OPTIMIZERS, SCHEDULES
from pipeline.train.step import StepRunner, all_reduce_sum
from pipeline.train.unigram import heldout_unigram_perplexity

RUN_FILE = "run.json"
EXPORT_DIR = "export"


class TrainError(RuntimeError):
    """A training run that cannot start or did not finish; one line naming the cause."""


# ---- the plan the driver hands to the workers ------------------------------------------------


@dataclass
class RunPlan:
    """Facts the driver resolves once and hands to every worker (as a dict: it crosses to Ray).

    ``options``: the model's inference options.json dict; ``total_steps``: steps of the whole run
    (a resumed run continues up to it); ``unigram_perplexity``: the held-out baseline;
    ``use_gpu``: set from the cluster just before launch."""

    run_dir: str
    name: str
    shards: str
    manifest: dict
    vocab_size: int
    total_steps: int
    steps_per_epoch: int
    unigram_perplexity: float
    options: dict
    init_from: str
    storage_endpoint: str
    use_gpu: bool = False


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


def _model_options(cfg: Any) -> dict:
    if not cfg.init_from:
        return BiLMOptions.from_dict(to_options(cfg.model)).to_dict()
    path = storage.join(str(cfg.init_from), export_mod.OPTIONS_FILE)
    for name in (export_mod.OPTIONS_FILE, export_mod.WEIGHTS_FILE):
        if not storage.exists(storage.join(str(cfg.init_from), name)):
            raise TrainError(f"init_from {cfg.init_from}: no {name} there")
    try:
        return BiLMOptions.from_dict(json.loads(storage.read_bytes(path))).to_dict()
    except json.JSONDecodeError as err:
        raise TrainError(f"init_from {path}: not valid JSON ({err})") from None


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


def prepare_run(cfg: Any) -> RunPlan:
    """Validate a resolved TrainConfig and resolve the run's facts (no Ray needed)."""
    if cfg.storage_endpoint:
        storage.configure(endpoint_url=str(cfg.storage_endpoint))
    shards = storage.absolute(str(cfg.shards).rstrip("/"))
    run_dir = storage.absolute(str(cfg.output).rstrip("/"))
    require_at_least(
        cfg,
        (
            "workers",
            "batch_size",
            "unroll_steps",
            "threads_per_worker",
            "log_every",
            "checkpoint_every",
            "eval_batch_size",
        ),
        error=TrainError,
    )
    if not 0 <= float(cfg.dropout) < 1:
        raise TrainError(f"config key 'dropout' must be in [0, 1), got {cfg.dropout}")
    for key, allowed in (
        ("use_gpu", ("auto", "true", "false")),
        ("optimizer.name", OPTIMIZERS),
        ("optimizer.schedule", SCHEDULES),
        ("wandb.mode", WANDB_MODES),
    ):
        require_choice(cfg, key, allowed, error=TrainError)
    manifest = shard_format.read_manifest(shards)
    vocab = shard_format.read_vocab(shard_format.vocab_path(shards, manifest))
    if len(vocab) != manifest["vocab"]["size"]:
        raise TrainError(
            f"shard directory {shards}: vocab.txt has {len(vocab)} tokens, the manifest says {manifest['vocab']['size']}"
        )
    _check_shards(shards, manifest)
    workers, batch, unroll = int(cfg.workers), int(cfg.batch_size), int(cfg.unroll_steps)
    per_epoch = steps_per_epoch(manifest, batch, unroll, workers)
    total = int(cfg.max_steps) or int(cfg.n_epochs) * per_epoch
    if total <= 0:
        raise TrainError(
            f"{manifest['totals']['train']['tokens']} training tokens are less than one global batch "
            f"(batch_size {batch} x unroll_steps {unroll} x workers {workers}); set max_steps or shrink the batch"
        )
    heldout = manifest["totals"]["heldout"]
    if heldout["tokens"] + heldout["sentences"] < int(cfg.eval_batch_size) * workers:
        raise TrainError(
            f"the held-out split ({heldout['tokens']} tokens) cannot fill {int(cfg.eval_batch_size)} rows on each of "
            f"{workers} workers; lower eval_batch_size"
        )
    if cfg.softmax.sampled and not 0 < int(cfg.softmax.negatives) < len(vocab):
        raise TrainError(
            f"softmax.negatives ({cfg.softmax.negatives}) must be in [1, vocabulary size {len(vocab)}); "
            "use fewer or softmax.sampled=false"
        )
    options = _model_options(cfg)
    name = str(cfg.name) or run_dir.rstrip("/").rsplit("/", 1)[-1]
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
        init_from=storage.absolute(str(cfg.init_from)),
        storage_endpoint=str(cfg.storage_endpoint),
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


def _cluster_check(cfg: Any) -> bool:
    """Whether to use GPUs; a TrainError when the cluster cannot hold the workers."""
    resources = _cluster_resources()
    workers, threads = int(cfg.workers), int(cfg.threads_per_worker)
    gpus = resources.get("GPU", 0)
    use_gpu = {"auto": gpus >= 1, "true": True, "false": False}[str(cfg.use_gpu)]
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


def run_training(cfg: Any, plan: RunPlan | None = None) -> dict:
    """Run (or resume) a training run; Ray must be initialised. ``plan``: from ``prepare_run(cfg)``
    (computed here when None). Returns the final status row (end-of-run held-out perplexities)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchConfig, TorchTrainer

    plan = prepare_run(cfg) if plan is None else plan
    plan.use_gpu = _cluster_check(cfg)
    ray_storage = tempfile.mkdtemp(prefix="elmo-ray-train-")
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": to_dict(cfg), "plan": dataclasses.asdict(plan)},
        torch_config=TorchConfig(backend="nccl" if plan.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=int(cfg.workers),
            use_gpu=plan.use_gpu,
            resources_per_worker=None if plan.use_gpu else {"CPU": int(cfg.threads_per_worker)},
        ),
        run_config=RunConfig(
            name=plan.name,
            storage_path=ray_storage,
            failure_config=FailureConfig(max_failures=int(cfg.max_failures)),
            worker_runtime_env={"env_vars": worker_env()},
        ),
    )
    try:
        trainer.fit()
    except TrainingFailedError as err:  # surface the worker's own last line, not Ray's traceback
        raise TrainError(f"training failed: {_failure_message(err)}") from None
    finally:
        shutil.rmtree(ray_storage, ignore_errors=True)
    return final_status(plan.run_dir)


def final_status(run_dir: str) -> dict:
    """The last ``status`` row rank 0 wrote to metrics.jsonl; a TrainError unless it says ``done``."""
    path = storage.join(run_dir, METRICS_FILE)
    rows = [r for r in read_metrics(path) if r.get("kind") == "status"] if storage.exists(path) else []
    if not rows:
        raise TrainError(f"training ended without a final status in {path}")
    if rows[-1].get("status") != "done":
        raise TrainError(str(rows[-1].get("message", "training stopped")))
    return rows[-1]


# ---- the per-worker loop ---------------------------------------------------------------------


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class WorkerRun:
    """One rank's training run: data, checkpoints, evaluation and logging around a ``StepRunner``.

    ``cfg`` is the resolved TrainConfig (an OmegaConf DictConfig). ``report``: also send every
    logged row to ``ray.train.report`` (under Ray Train; every rank must then report alike).
    Outside Ray Train (``report=False``, no process group) it runs as a single rank in-process.
    """

    def __init__(self, cfg: Any, plan: RunPlan, device: torch.device, report: bool = False):
        self.cfg, self.plan, self.device, self.report = cfg, plan, device, report
        if plan.storage_endpoint:
            storage.configure(endpoint_url=plan.storage_endpoint)
        self.runner = StepRunner(cfg, plan.options, plan.vocab_size, device)
        self.rank, self.world = self.runner.rank, self.runner.world
        self.vocab_bytes = storage.read_bytes(shard_format.vocab_path(plan.shards, plan.manifest))
        self.cache = CharCache(shard_format.parse_vocab(self.vocab_bytes.decode("utf-8")))
        self.batches = open_lm_batches(
            plan.shards,
            "train",
            self.cache,
            int(cfg.batch_size),
            int(cfg.unroll_steps),
            rank=self.rank,
            world_size=self.world,
            seed=int(cfg.seed),
            manifest=plan.manifest,
        )
        self.resumed_from: int | None = None
        resume = ckpt.latest_checkpoint(plan.run_dir)
        if resume is not None:
            self._restore(resume)
        elif plan.init_from:
            self._init_from(plan.init_from)
        self.runner.distribute()
        self.log = MetricsLog(plan.run_dir, self.resumed_from) if self.rank == 0 else None
        self.flops_per_step = self.runner.flops_per_step(int(cfg.batch_size), int(cfg.unroll_steps))
        self.peak_flops = measure_matmul_peak(device, self.runner.autocast_dtype or torch.float32)

    @property
    def bilm(self) -> BiLM:
        return self.runner.bilm

    @property
    def softmax(self) -> SharedSoftmax:
        return self.runner.softmax

    @property
    def step(self) -> int:
        return self.runner.step

    # -- state ---------------------------------------------------------------------------------
    def _restore(self, path: str) -> None:
        runner = self.runner
        payload = ckpt.load_model(path)
        if payload["options"] != self.plan.options:
            raise ckpt.CheckpointError(f"checkpoint {path} holds a different model than the config asks for")
        runner.bilm.load_state_dict(payload["bilm"])
        runner.softmax.load_state_dict(payload["softmax"])
        runner.load_optimizer_state(payload["optimizer"])
        runner.step = int(payload["step"])
        mine = ckpt.load_rank(path, self.rank, self.world)
        self.batches.load_state_dict(mine["data"])
        if mine["c"] is not None:
            if mine["c"].shape != runner.c.shape or mine["h"].shape != runner.h.shape:
                raise ckpt.CheckpointError(
                    f"checkpoint {path} holds LSTM states of shape {tuple(mine['c'].shape)} for "
                    f"{tuple(runner.c.shape)}; was batch_size changed?"
                )
            runner.c.copy_(mine["c"])
            runner.h.copy_(mine["h"])
        ckpt.restore_rng_states(mine["rng"], runner.generator)
        self.resumed_from = runner.step

    def _init_from(self, source: str) -> None:
        """Continue pretraining from released weights (and their softmax when the vocabulary matches)."""
        names = (
            export_mod.OPTIONS_FILE,
            export_mod.WEIGHTS_FILE,
            export_mod.SOFTMAX_FILE,
            export_mod.VOCAB_FILE,
        )
        with tempfile.TemporaryDirectory(prefix="elmo-init-") as tmp:
            local = {}
            for name in names:
                if storage.exists(storage.join(source, name)):
                    local[name] = os.path.join(tmp, name)
                    storage.download_file(storage.join(source, name), local[name])
            loaded = BiLM.from_files(local[export_mod.OPTIONS_FILE], local[export_mod.WEIGHTS_FILE])
            self.bilm.load_state_dict(loaded.state_dict())
            if export_mod.SOFTMAX_FILE in local and export_mod.VOCAB_FILE in local:
                with open(local[export_mod.VOCAB_FILE], "rb") as f:
                    same_vocab = f.read() == self.vocab_bytes
                if same_vocab:
                    weight, bias = export_mod.read_softmax(local[export_mod.SOFTMAX_FILE])
                    with torch.no_grad():
                        self.softmax.weight.copy_(torch.from_numpy(weight))
                        self.softmax.bias.copy_(torch.from_numpy(bias))

    def save_checkpoint(self) -> None:
        runner = self.runner
        path = ckpt.checkpoint_path(self.plan.run_dir, runner.step)
        ckpt.save_rank(
            path,
            self.rank,
            {
                "data": self.batches.state_dict(),
                "c": runner.c.cpu(),
                "h": runner.h.cpu(),
                "rng": ckpt.rng_states(runner.generator),
            },
        )
        if self.rank == 0:
            ckpt.save_model(
                path,
                {
                    "options": self.plan.options,
                    "bilm": runner.bilm.state_dict(),
                    "softmax": runner.softmax.state_dict(),
                    "optimizer": runner.optimizer_state(),
                    "step": runner.step,
                    "config": to_dict(self.cfg),
                    "vocab": self.vocab_bytes,
                },
            )
        _barrier()
        if self.rank == 0:
            ckpt.mark_complete(path, runner.step, self.world)
            ckpt.prune(self.plan.run_dir, int(self.cfg.keep_checkpoints))

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self) -> dict:
        cfg = self.cfg
        batches = open_lm_batches(
            self.plan.shards,
            "heldout",
            self.cache,
            int(cfg.eval_batch_size),
            EVAL_UNROLL_STEPS,
            rank=self.rank,
            world_size=self.world,
            test=True,
            manifest=self.plan.manifest,
        )
        max_batches = -(-int(cfg.eval_max_batches) // self.world) if cfg.eval_max_batches else 0
        sums = heldout_sums(
            self.runner.lm, self.softmax, batches, self.device, max_batches, self.runner.autocast_dtype
        )
        counts = torch.cat([sums.losses, torch.tensor([float(sums.batches)], dtype=torch.float64)])
        total = all_reduce_sum(counts.to(self.device)).cpu()  # NCCL reduces only CUDA tensors
        result = HeldoutSums(total[:3], int(total[3])).perplexities()
        result["eval/unigram_perplexity"] = self.plan.unigram_perplexity
        result["eval/batches"] = int(total[3])
        return result

    # -- the loop ------------------------------------------------------------------------------
    def _emit(self, row: dict, sink) -> None:
        if self.log is not None:
            self.log.append(row)
            sink.log(row, row["step"])
        self._report(row)

    def _report(self, row: dict) -> None:
        if self.report:
            import ray.train

            ray.train.report(row)

    def run(self) -> dict:
        cfg, plan = self.cfg, self.plan
        sink = WandbSink(cfg.wandb, plan.run_dir, plan.name, to_dict(cfg)) if self.rank == 0 else None
        if self.log is not None and self.resumed_from is None:
            self.log.append(
                {"kind": "config", "step": 0, "config": to_dict(cfg), "total_steps": plan.total_steps}
            )
        if self.log is not None and self.resumed_from is not None:
            self.log.append(
                {"kind": "event", "step": self.step, "event": "resume", "from_step": self.resumed_from}
            )
        # The step never waits for the device; the loop does, only where it reads results (a log
        # line, an evaluation, a checkpoint), so the host prepares the next batches meanwhile.
        compute, steps_timed, start = 0.0, 0, time.perf_counter()
        window = start
        status = {"kind": "status", "step": self.step, "status": "done"}
        while self.step < plan.total_steps:
            out = self.runner.train_step(next(self.batches), plan.total_steps)
            steps_timed += 1
            last = self.step == plan.total_steps
            log_now = self.step % int(cfg.log_every) == 0 or last
            eval_now = bool(cfg.eval_every) and self.step % int(cfg.eval_every) == 0 and not last
            checkpoint_now = self.step % int(cfg.checkpoint_every) == 0 or last
            if not (log_now or eval_now or checkpoint_now):
                continue
            skipped = self.runner.nonfinite_steps()  # waits for the device
            compute += time.perf_counter() - window
            if skipped:
                status = {
                    "kind": "status",
                    "step": self.step,
                    "status": "nan",
                    "message": f"non-finite loss or gradient in {skipped} of the steps up to step {self.step} "
                    f"(nothing was updated in those); stopped, the last good checkpoint is "
                    f"{ckpt.latest_checkpoint(plan.run_dir) or 'none'}",
                }
                break
            if log_now:
                fwd, bwd = out.losses.tolist()
                tokens = 2 * int(cfg.batch_size) * int(cfg.unroll_steps) * self.world * steps_timed
                self._emit(
                    {
                        "kind": "train",
                        "step": self.step,
                        "epoch": self.step / max(plan.steps_per_epoch, 1),
                        "train/loss": 0.5 * (fwd + bwd),
                        "train/perplexity": perplexity(0.5 * (fwd + bwd)),
                        "train/perplexity_fwd": perplexity(fwd),
                        "train/perplexity_bwd": perplexity(bwd),
                        "train/lr": out.lr,
                        "train/grad_norm": float(out.grad_norm),
                        "train/tokens_per_s": tokens / compute,
                        "train/mfu": self.flops_per_step * steps_timed / compute / self.peak_flops,
                        "train/softmax_rows": int(out.rows),
                        "train/softmax_exchange_bytes": out.exchange_bytes,
                        "train/softmax_dense_bytes": out.dense_bytes,
                        "time": time.perf_counter() - start,
                    },
                    sink,
                )
                compute, steps_timed = 0.0, 0
            if eval_now:
                self._emit({"kind": "eval", "step": self.step, **self.evaluate()}, sink)
            if checkpoint_now:
                self.save_checkpoint()
            window = time.perf_counter()  # evaluation and checkpoints are not training time
        status["step"] = self.step
        if status["status"] == "done":
            final = {"kind": "eval", "step": self.step, **self.evaluate()}
            self._emit(final, sink)
            if self.rank == 0:
                with torch.no_grad():
                    export_mod.export_model(
                        self.bilm, self.softmax, self.vocab_bytes, storage.join(plan.run_dir, EXPORT_DIR)
                    )
                plot_perplexity(self.log.rows, storage.join(plan.run_dir, PLOT_FILE))
            status.update({k: v for k, v in final.items() if k != "kind"})
        if self.log is not None:
            self.log.append(status)
        if sink is not None:
            sink.finish()
        _barrier()
        self._report(status)
        return status


def _quiet_report_log() -> None:
    """Ray Train V2 logs every ``ray.train.report`` call at INFO, one long line per logged step on
    the driver's console; the same rows already go to metrics.jsonl and wandb, so keep its warnings
    only. The logger is internal (named by its file), so a Ray without it is simply left alone."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop_per_worker(loop_config: dict) -> None:
    """The function Ray Train runs on every worker."""
    import ray.train.torch

    _quiet_report_log()

    cfg = OmegaConf.create(loop_config["config"])
    plan = RunPlan(**loop_config["plan"])
    torch.set_num_threads(int(cfg.threads_per_worker))
    device = ray.train.torch.get_device() if plan.use_gpu else torch.device("cpu")
    WorkerRun(cfg, plan, device, report=True).run()


__all__ = [
    "TrainError",
    "RunPlan",
    "prepare_run",
    "run_training",
    "final_status",
    "train_loop_per_worker",
    "WorkerRun",
]
