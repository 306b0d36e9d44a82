"""One rank's training run: the loop, read top to bottom (docs/training.md).

The driver side (checks, plan, Ray Train launch) is ``launch.py``; the step is ``step.py``; this
is what every worker runs around it. The loop (``Trainer``) feeds the step batches and asks its
components whether they are due: the run log (every ``log_every`` steps), the evaluator (every
``eval_every``), the checkpointer (every ``checkpoint_every``, and each at the last step). Only
then does it wait for the device. The divergence guard reads before each log line and checkpoint
and says what to do about a divergence; the loop does it. Everything the run writes in its
directory goes through the run's ``RunWriter`` (``run_dir``), so no step waits for the storage,
and no step waits for Ray either: rows reach the driver through an actor call that is not awaited.
Every rank runs the same number of steps, because the row streams never run dry (``data``).
"""

from __future__ import annotations

import functools
import itertools
import time
from typing import Any, NamedTuple

import torch

from pipeline.config import to_dict
from pipeline.errors import PipelineError
from pipeline.output_folder import fence
from pipeline.probe.live import LiveProbe
from pipeline.runtime import storage
from pipeline.train import export as export_mod
from pipeline.train.char_cache import CharCache
from pipeline.train.checkpoint import Checkpointer, RNGStates, latest_checkpoint
from pipeline.train.config import OnDivergence, TrainConfig
from pipeline.train.data import open_lm_batches
from pipeline.train.distributed import barrier
from pipeline.train.divergence import DivergenceGuard, GuardReading
from pipeline.train.errors import TrainError
from pipeline.train.evaluate import EVAL_UNROLL_STEPS, Evaluator, final_eval_batches, perplexity
from pipeline.train.metrics import RunLog, measure_matmul_peak, plot_perplexity
from pipeline.train.plan import RunPlan
from pipeline.train.run_dir import RunDir, RunWriter
from pipeline.train.run_length import RunLength, end_cost_s
from pipeline.train.sentence_source import ReadAhead
from pipeline.train.step import StepResult, StepRunner
from pipeline.train.stop import StopCheck


class Due(NamedTuple):
    """Which of the loop's components are due after a step (each decides its own timing)."""

    log: bool
    evaluate: bool
    checkpoint: bool
    probe: bool


class Trainer:
    """One rank's training run: data, checkpoints, evaluation and logging around a ``StepRunner``.

    ``cfg`` is the resolved TrainConfig. ``relay``: the driver's ``progress.ProgressRelay`` actor,
    which rank 0 hands each row to (None: no driver to tell). Outside Ray Train (no process group)
    it runs as a single rank in-process.
    """

    def __init__(self, cfg: TrainConfig, plan: RunPlan, device: torch.device, relay: Any = None):
        self.cfg, self.plan, self.device = cfg, plan, device
        if plan.storage_endpoint:
            storage.configure(endpoint_url=plan.storage_endpoint)
        self.run_dir = RunDir(plan.run_dir)
        self.writer = RunWriter(fence=self._lease_fence(plan))
        self.runner = runner = StepRunner(cfg, plan.options, plan.vocab_size, device)
        self.rank, self.world = runner.rank, runner.world
        self.vocab_bytes, vocab = plan.manifest.read_vocab()
        self.cache = CharCache(vocab)
        self.batches = self._batches("train", cfg.batch_size, cfg.unroll_steps, seed=cfg.seed)
        self.guard = DivergenceGuard(cfg.guard, self._guard_sample()) if cfg.guard.enabled else None
        guarded = {"guard": self.guard} if self.guard is not None else {}
        self.length = RunLength(plan.ceiling_steps, plan.deadline, cfg.log_every)
        self.checkpointer = Checkpointer(
            plan.run_dir,
            self.rank,
            self.world,
            every=cfg.checkpoint_every,
            keep=cfg.keep_checkpoints,
            shared={
                "bilm": runner.bilm,
                "softmax": runner.softmax,
                "optimizer": runner.optimizer,
                "length": self.length,
                **guarded,
            },
            own={"data": self.batches, "lstm": runner.state, "rng": RNGStates(runner.generator)},
            meta={"options": plan.options, "config": to_dict(cfg), "vocab": self.vocab_bytes},
            writes=self.writer.checkpoints,
        )
        self.resumed_from = self.checkpointer.restore()
        if self.resumed_from is not None:
            runner.step = self.resumed_from
            runner.lr_scale = self.guard.lr_scale if self.guard is not None else 1.0
        elif plan.init_from:
            export_mod.load_pretrained(plan.init_from, runner.bilm, runner.softmax, self.vocab_bytes)
        runner.distribute()
        self.evaluator = Evaluator(
            cfg,
            # a thread reads ahead here: a process per evaluation would cost more than it saves
            lambda: self._batches(
                "heldout", cfg.eval_batch_size, EVAL_UNROLL_STEPS, test=True, prefetch=ReadAhead.thread
            ),
            plan.baselines,
            self.world,
        )
        self.log = RunLog(cfg, plan, self.rank, self.resumed_from, self.writer, relay, self.world)
        self.probe = LiveProbe(cfg.probe_every if self.rank == 0 else 0)  # rank 0 probes alone
        self.stop = StopCheck(relay, self.rank, device)
        self.peak_flops = measure_matmul_peak(device, runner.autocast_dtype or torch.float32)

    @staticmethod
    def _lease_fence(plan: RunPlan):
        """The check before each write that the driver still holds the run directory (None without
        a driver): a run whose directory was taken over writes nothing more and stops."""
        if not plan.lease_owner:
            return None
        return functools.partial(fence, plan.run_dir, plan.lease_owner, TrainError, "run directory")

    def _batches(self, split: str, batch_size: int, unroll_steps: int, **kwargs):
        return open_lm_batches(
            self.plan.manifest.folder,
            split,
            self.cache,
            batch_size,
            unroll_steps,
            rank=self.rank,
            world_size=self.world,
            manifest=self.plan.manifest,
            **kwargs,
        )

    def _guard_sample(self) -> list:
        """The guard's fixed sample: this rank's first ``guard.batches`` held-out batches."""
        batches = self._batches(
            "heldout", self.cfg.eval_batch_size, EVAL_UNROLL_STEPS, test=True, prefetch=ReadAhead.off
        )
        return list(itertools.islice(batches, self.cfg.guard.batches))

    @property
    def step(self) -> int:
        return self.runner.step

    def evaluate(self, final: bool = True) -> dict:
        runner = self.runner
        result = self.evaluator.run(runner.lm, runner.softmax, self.device, runner.autocast_dtype, final)
        return {**result, "train_s": self.length.train_s}

    # -- the run, top to bottom ----------------------------------------------------------------
    def run(self) -> dict:
        """Train to the plan's last step, then evaluate and export; returns the status row."""
        try:
            status = self._train()
        finally:
            self.batches.close()  # its read-ahead processes
        status["step"] = self.step
        if status["status"] == "done":
            final = {"kind": "eval", "step": self.step, **self.evaluate()}
            self.log.emit(final)
            if self.rank == 0:
                with torch.no_grad():
                    export_mod.export_model(
                        self.runner.bilm,
                        self.runner.softmax,
                        self.vocab_bytes,
                        self.run_dir.export,
                        {"run": self.plan.run_dir, "name": self.plan.name, "step": self.step},
                    )
                self.log.produce_model(self.run_dir.export)
                plot_perplexity(self.log.rows, self.run_dir.plot)
            status.update({k: v for k, v in final.items() if k != "kind"})
        self.log.finish_with(status)
        self.writer.close()  # every row, wandb file and checkpoint is written
        barrier()  # and every rank's: a rank that returns first would find its group gone
        return status

    def _train(self) -> dict:
        """The step loop, then the rows of the probes still running; returns the run's status row."""
        try:
            status = self._steps()
        except BaseException:
            self.probe.abandon()
            raise
        if status["status"] == "stopped":  # the grace period is short: no waiting for a probe
            self.probe.abandon()
            return status
        for probe in self.probe.finish():
            self.log.emit_probe(probe)
        return status

    def _steps(self) -> dict:
        """The step loop: steps until the run's last step, a non-finite step or a divergence that
        stops the run; returns the run's status row."""
        runner, log = self.runner, self.log
        status = {"kind": "status", "step": self.step, "status": "done"}
        # The step never waits for the device; the loop does, only where a component is due (a log
        # line, an evaluation, a checkpoint), so the host prepares the next batches meanwhile.
        length = self.length
        if length.resumed_plan:
            self._say_kept_plan()
        components = (log, self.evaluator, self.checkpointer, self.probe)
        compute, steps_timed, flops, start = 0.0, 0, 0, time.perf_counter()
        window = start
        while self.step < length.last_step:
            out = runner.train_step(next(self.batches), length.schedule_steps)
            steps_timed += 1
            flops += out.flops
            replan, stopping = length.due(self.step), self.stop.due(self.step)
            last = self.step == length.last_step
            due = Due(*(c.due(self.step, last) for c in components))
            if not (replan or stopping or any(due)):
                continue
            skipped = runner.nonfinite_steps()  # waits for the device
            trained = time.perf_counter() - window
            compute += trained
            length.add_training(trained)
            if skipped:
                return self._stopped_on_nonfinite(skipped)
            if stopping and self.stop.check(self.step):
                return self._stopped_on_request()
            if replan and self._replan():  # the time budget ends the run at this step
                last = True
                due = Due(*(c.due(self.step, last) for c in components))
            # the guard reads before every log line and every checkpoint: a checkpoint is saved only
            # after a reading, so a rollback finds the state of before a divergence
            reading = self._read_guard() if due.log or due.checkpoint else None
            if due.log:
                row = self._train_row(out, steps_timed, compute, flops, time.perf_counter() - start)
                if reading is not None:
                    row.update(reading.metrics(), **{"guard/rollbacks": self.guard.rollbacks})
                log.emit(row)
                compute, steps_timed, flops = 0.0, 0, 0
            if reading is not None and reading.diverged:
                stop = self._act_on_divergence(reading)
                if stop is not None:
                    return stop
                if self.step < reading.step:  # rolled back: that step's evaluation and checkpoint are moot
                    window = time.perf_counter()
                    continue
            if due.evaluate:
                log.emit({"kind": "eval", "step": self.step, **self.evaluate(final=False)})
            if due.probe:
                self.probe.start(runner.bilm, self.step, last)
            for probe in self.probe.ready():  # probes run beside the steps: their rows come when done
                log.emit_probe(probe)
            if self.checkpointer.save(self.step, last):
                log.save_tracking()  # the wandb history reaches an s3 run directory with each checkpoint
            window = time.perf_counter()  # evaluation and checkpoints are not training time
        return status

    def _replan(self) -> bool:
        """Fit the run's last step to its time budget (`RunLength`); the first time, an evaluation
        prices the end of the run (its evaluation and export). Returns whether this step is now the
        last."""
        length = self.length
        if not length.end_s:
            row = {"kind": "eval", "step": self.step, **self.evaluate(final=False)}
            self.log.emit(row)
            length.note_end_cost(self._end_cost(row))
        before, was_planned = length.last_step, length.planned
        total = length.replan(self.step, self.device)
        if total != before or (length.planned and not was_planned):
            self.log.emit(
                {
                    "kind": "plan",
                    "step": self.step,
                    "plan/total_steps": total,
                    "plan/first": int(not was_planned),
                    "plan/end_s": length.end_s,
                    "plan/deadline_in_s": self.plan.deadline - time.time(),
                }
            )
        return self.step >= total

    def _say_kept_plan(self) -> None:
        """A resumed run keeps its first invocation's plan (`RunLength`): the driver's progress is
        told the planned last step (it knows only the ceiling), and whether this invocation's own
        time budget goes unused. Not on the dashboard: its history has this step already."""
        self.log.emit(
            {
                "kind": "plan",
                "step": self.step,
                "plan/total_steps": self.length.last_step,
                "plan/resumed": 1,
                "plan/budget_unused": int(bool(self.plan.deadline)),
            },
            to_wandb=False,
        )

    def _end_cost(self, eval_row: dict) -> float:
        """`run_length.end_cost_s` of this run, from an evaluation during it (``eval_row``)."""
        per_rank = -(-int(eval_row["eval/batches"]) // self.world)
        final = final_eval_batches(self.cfg, self.plan.manifest, self.world)
        export_bytes = 4 * sum(p.numel() for p in self.runner.bilm.parameters())
        export_bytes += 4 * self.runner.softmax.weight.numel()
        return end_cost_s(float(eval_row["eval/seconds"]), per_rank, final, export_bytes)

    def _read_guard(self) -> GuardReading | None:
        if self.guard is None:
            return None
        runner = self.runner
        return self.guard.read(self.step, runner.lm, runner.softmax, self.device, runner.autocast_dtype)

    def _act_on_divergence(self, reading: GuardReading) -> dict | None:
        """Do what the guard decides about a divergence; returns the run's final status row when
        the run stops, None when it goes on (after a warning, or rolled back)."""
        guard, runner = self.guard, self.runner
        decision = guard.decide(reading)
        row = {"kind": "guard", "step": self.step, "guard/diverged": 1, **reading.metrics()}
        if decision.action is OnDivergence.rollback:
            self.checkpointer.wait()
            restored = guard.roll_back(self.checkpointer.restore)
            if restored is None:  # diverged before the first save: nothing is lost by training on
                decision = decision.trained_on("no checkpoint to roll back to")
            else:
                runner.step, runner.lr_scale = restored, guard.lr_scale
                runner.reset_graph()  # the optimizer's state tensors are new ones
                decision = decision.noting(
                    f"rolled back to the checkpoint of step {restored}, learning rate x{guard.lr_scale:g} "
                    f"(rollback {guard.rollbacks} of at most {self.cfg.guard.max_rollbacks})"
                )
                row.update({"guard/rollbacks": guard.rollbacks, "to_step": restored})
        row.update(action=decision.action.value, message=decision.message)
        self.log.emit(row)
        if decision.action is not OnDivergence.stop:
            return None
        self.checkpointer.wait()
        return {
            "kind": "status",
            "step": self.step,
            "status": "diverged",
            "message": f"{decision.message}; stopped (guard.on_divergence={self.cfg.guard.on_divergence.value}), "
            f"the last checkpoint is {latest_checkpoint(self.plan.run_dir) or 'none'}",
        }

    def _stopped_on_request(self) -> dict:
        """The driver was asked to stop (`StopCheck`): this step's checkpoint, complete before the
        run ends, is where a rerun continues."""
        self.checkpointer.save(self.step, last_step=True)
        return {
            "kind": "status",
            "step": self.step,
            "status": "stopped",
            "message": f"stopped at step {self.step}; checkpoint {latest_checkpoint(self.plan.run_dir)}; "
            "rerun the same command to continue",
        }

    def _stopped_on_nonfinite(self, skipped: int) -> dict:
        self.checkpointer.wait()  # a save still in flight is the last good checkpoint
        return {
            "kind": "status",
            "step": self.step,
            "status": "nan",
            "message": f"non-finite loss or gradient in {skipped} of the steps up to step {self.step} "
            f"(nothing was updated in those); stopped, the last good checkpoint is "
            f"{latest_checkpoint(self.plan.run_dir) or 'none'}",
        }

    def _train_row(
        self, out: StepResult, steps_timed: int, compute: float, flops: int, elapsed: float
    ) -> dict:
        cfg = self.cfg
        fwd, bwd = out.losses.tolist()
        tokens = 2 * cfg.tokens_per_step(self.world) * steps_timed
        return {
            "kind": "train",
            "step": self.step,
            "epoch": self.step / max(self.plan.steps_per_epoch, 1),
            "train/loss": 0.5 * (fwd + bwd),
            "train/sampled_perplexity": perplexity(0.5 * (fwd + bwd)),
            "train/sampled_perplexity_fwd": perplexity(fwd),
            "train/sampled_perplexity_bwd": perplexity(bwd),
            "train/lr": out.lr,
            "train/grad_norm": float(out.grad_norm),
            "train/tokens_per_s": tokens / compute,
            "train/mfu": flops / compute / self.peak_flops,
            "train/softmax_rows": int(out.rows),
            "train/softmax_exchange_bytes": out.exchange_bytes,
            "train/softmax_dense_bytes": out.dense_bytes,
            **self.checkpointer.take_metrics(),
            "time": elapsed,
            "train_s": self.length.train_s,
        }


def train_loop_per_worker(loop_config: dict) -> None:
    """The function Ray Train runs on every worker: ``loop_config`` holds the run's TrainConfig,
    its RunPlan and the driver's progress relay, as the driver made them."""
    import ray.train.torch

    cfg: TrainConfig = loop_config["config"]
    plan: RunPlan = loop_config["plan"]
    torch.set_num_threads(cfg.threads_per_worker)
    device = ray.train.torch.get_device() if plan.use_gpu else torch.device("cpu")
    try:
        Trainer(cfg, plan, device, relay=loop_config["relay"]).run()
    except PipelineError as err:
        # The driver says this in one line (and decides whether to restart). What Ray prints of a
        # worker's failure ("Error in training function" and its traceback) stays about as short:
        # without the frames that led here or the chained internals of, say, the storage client
        # (a 30 s S3 pause put 145 lines of our, urllib3's and botocore's frames on the console).
        # A bug (any other exception) keeps its whole traceback.
        raise err.with_traceback(None) from None
