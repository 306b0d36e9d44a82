"""One training run on Ray Train, as the driver fits it: its attempts (``fit_with_restarts``: a lost
worker restarts the run from its latest checkpoint, an error about the input ends it), each a
``TorchTrainer`` that Ray never restarts itself, and the driver's graceful stop while it trains
(``graceful_stop``: the first SIGTERM or Ctrl-C stops after a step with its checkpoint, a second one
or the grace period's end aborts; docs/reliability.md#stopping). ``launch.run_training`` calls it.
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile

from pipeline.errors import PipelineError
from pipeline.runtime import ray_runtime, stopping, storage
from pipeline.runtime.stopping import GracefulStop, stop_error
from pipeline.train.checkpoint import latest_checkpoint
from pipeline.train.config import TrainConfig
from pipeline.train.errors import TrainError
from pipeline.train.plan import RunPlan
from pipeline.train.trainer import train_loop_per_worker


def _failure_message(err: BaseException) -> str:
    failures = getattr(err, "worker_failures", None) or {}
    for failure in failures.values():
        lines = [line for line in str(failure).strip().splitlines() if line.strip()]
        if lines:
            return lines[-1].strip()
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(err).__name__


def fit_with_restarts(cfg: TrainConfig, plan: RunPlan, relay) -> int | None:
    """Attempts until one succeeds: a lost worker restarts the run (up to ``max_failures`` times,
    each resuming from the latest checkpoint); an error about the input ends it at once. Returns
    the signal that asked the run to stop (`GracefulStop`), None when none did."""
    from ray.train import TrainingFailedError

    for attempt in range(cfg.max_failures + 1):
        try:
            return _fit(cfg, plan, relay)
        except TrainingFailedError as err:  # surface the worker's own last line, not Ray's traceback
            message = _failure_message(err)
            if not _worth_retrying(err):
                raise TrainError(f"training failed: {message} (not retried: it would fail again)") from None
            if attempt == cfg.max_failures:
                raise TrainError(
                    f"training failed: {message} (after {cfg.max_failures} restarts, max_failures)"
                ) from None
            print(
                f"training attempt {attempt + 1} failed: {message}; restarting from the latest checkpoint "
                f"({attempt + 1} of max_failures={cfg.max_failures})",
                file=sys.stderr,
            )


GRACE_S = 25.0
"""How long a run asked to stop gets to reach a step boundary and write its checkpoint before it
is aborted: within Kubernetes' default 30 s grace period, with time left to stop the cluster."""


PROMISE = "stopping after the current step, whose checkpoint is written"
"""What the first signal's line says the run will do."""


def graceful_stop(relay) -> GracefulStop:
    """The driver's signals while a run trains: the first SIGTERM or SIGINT asks the run to stop
    after its current step, that step's checkpoint written (``pipeline.train.stop``), and gives it
    ``GRACE_S``; a second signal, or the grace period passed, aborts it as Ray Train's own Ctrl-C
    does (the latest complete checkpoint stays)."""
    return GracefulStop(lambda: relay.request_stop.remote(), GRACE_S, PROMISE)


def aborted(graceful: GracefulStop, run_dir: str) -> str:
    """What an aborted stop kept: the latest complete checkpoint, and no export."""
    why = (
        f"no step boundary within the {GRACE_S:.0f} s grace period: a long step, or the final evaluation "
        "and export"
        if graceful.grace_over
        else "a second signal"
    )
    kept = (
        f"the latest checkpoint {kept} is kept" if (kept := latest_checkpoint(run_dir)) else "no checkpoint"
    )
    return f"aborted ({why}); {kept}, the run is not exported; rerun the same command to continue"


def _stoppable_trainer(graceful: GracefulStop):
    """Ray Train's ``TorchTrainer``, whose Ctrl-C handler (put in place as the run starts) becomes
    `GracefulStop`'s second signal."""
    from ray.train.torch import TorchTrainer

    class StoppableTrainer(TorchTrainer):
        def _register_sigint_handler(self, controller):
            super()._register_sigint_handler(controller)
            graceful.install(abort=stopping.current(signal.SIGINT))

        def _create_default_callbacks(self):
            # Ray Train's placement-group cleaner asks the State API every second whether the
            # controller lives; on a cluster without the dashboard each ask fails with a warning
            # (253 in a five-minute run on an H200), and it could never clean anything there
            callbacks = super()._create_default_callbacks()
            if ray_runtime.state_api_available():
                return callbacks
            return [c for c in callbacks if type(c).__name__ != "PlacementGroupCleanerCallback"]

    return StoppableTrainer


def _fit(cfg: TrainConfig, plan: RunPlan, relay) -> int | None:
    """One attempt: a ``TorchTrainer`` that Ray itself never restarts (``run_training`` decides).
    Returns the signal that asked it to stop, None when none did."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    ray_storage = tempfile.mkdtemp(prefix="elmo-ray-train-")
    graceful = graceful_stop(relay)
    trainer = _stoppable_trainer(graceful)(
        train_loop_per_worker,
        train_loop_config={"config": cfg, "plan": plan, "relay": relay},
        torch_config=TorchConfig(backend="nccl" if plan.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=cfg.workers,
            use_gpu=plan.use_gpu,
            resources_per_worker=None if plan.use_gpu else {"CPU": cfg.threads_per_worker},
        ),
        run_config=RunConfig(
            name=plan.name,
            storage_path=ray_storage,
            failure_config=FailureConfig(max_failures=0),
            **_quiet_train_logging(),
        ),
    )
    with graceful:  # its handlers in place (main thread only) and the ones before restored after
        try:
            trainer.fit()
        except SystemExit:
            # Ray Train's own SIGINT handler aborted the run (its workers stop; the latest complete
            # checkpoint stays as it was) and then exits the process; here that is a Ctrl-C (or a
            # SIGTERM) like any other, which the entry point reports with exit status 130 (or 143).
            raise stop_error(graceful.received, aborted(graceful, plan.run_dir)) from None
        except Exception:
            if graceful.received is not None:  # the run failed while stopping: stopped, not restarted
                raise stop_error(graceful.received) from None
            raise
        finally:
            shutil.rmtree(ray_storage, ignore_errors=True)
    return graceful.received


def _quiet_train_logging() -> dict:
    """``RunConfig`` keywords that keep Ray Train's INFO lines (worker group sizes, process group
    setup) off the console: the run's own progress lines say what is going on. ``LoggingConfig``
    came with a Ray newer than the lowest one supported; without it those lines stay."""
    import ray.train

    logging_config = getattr(ray.train, "LoggingConfig", None)
    return {"logging_config": logging_config(log_level="WARNING")} if logging_config else {}


DETERMINISTIC_ERRORS = (
    ValueError,
    TypeError,
    LookupError,
    AttributeError,
    AssertionError,
    ArithmeticError,
    MemoryError,
)
"""Built-in errors that a bad input or a bug raises the same way on every attempt; an allocation
that failed (MemoryError, or torch's own, :func:`_allocation_failed`) fails again at the same size."""


def _allocation_failed(failure: BaseException) -> bool:
    """torch's out-of-memory errors: CUDA's ``OutOfMemoryError``, the CPU allocator's RuntimeError."""
    import torch

    oom = getattr(torch, "OutOfMemoryError", ())
    return isinstance(failure, oom) or (
        isinstance(failure, RuntimeError) and "can't allocate memory" in str(failure)
    )


def _worth_retrying(err: BaseException) -> bool:
    """Whether another attempt can succeed: every worker failed because a process, node or
    connection was lost (a Ray error, a broken collective, a storage outage), none because the
    run's own code refused its input (a PipelineError other than a storage outage, or a built-in
    error that bad data or a bug raises). A full disk is not an outage: it stays full."""
    failures = list((getattr(err, "worker_failures", None) or {}).values())
    if not failures:  # the controller itself failed (e.g. the workers could not be placed)
        return False
    return not any(_deterministic(failure) for failure in failures)


def _deterministic(failure: BaseException) -> bool:
    if isinstance(failure, storage.StorageError) and not isinstance(failure, storage.OutOfSpace):
        return False
    return isinstance(failure, (PipelineError, *DETERMINISTIC_ERRORS)) or _allocation_failed(failure)
