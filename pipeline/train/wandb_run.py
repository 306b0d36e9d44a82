"""One wandb run per training run, across resumes and worker restarts.

The run's wandb id is made once, when the run directory is claimed, and kept in its ``run.json``
(``pipeline.tracking.offline_files.new_wandb_id``), so every attempt of the run logs under the
same id. Online, each attempt resumes that run (``resume="allow"``). Offline (the default), wandb cannot resume a run; each
attempt writes under its own ``RUN/wandb/attempt-NNN/`` (wandb's ``wandb/offline-run-<time>-<id>``
below it: wandb names that directory to the second, so two attempts within one second would share
it) and ``wandb sync --id <id>`` uploads them all into the one run, attempts in order
(``offline_files.sync_command`` prints the exact command).

For an ``s3://`` run directory the offline files are written locally and copied to ``RUN/wandb``
whenever :meth:`WandbRun.upload` is called (with each checkpoint; queued on the run's records queue, so the
training loop does not wait for the storage) and at the end, so a crash loses at most one
checkpoint interval of history.
"""

from __future__ import annotations

from typing import Any

from pipeline.formats.shard_format import KNESER_NEY_MAX_ORDER, UNIGRAM_METRIC, kneser_ney_metric
from pipeline.runtime.background import WriteQueue
from pipeline.tracking.artifacts import OutputArtifact, log_output, use_input
from pipeline.tracking.config import WandbMode
from pipeline.tracking.offline_files import OfflineCopy
from pipeline.tracking.stage_run import end_run, media, start_run
from pipeline.train.run_dir import RunDir

STEP_METRIC = "tokens"
"""Every curve's x-axis on the dashboard: training tokens seen (per direction, all workers), so runs
of different batch sizes compare (wandb's ``define_metric``); the step stays in each row."""
CURVES = ("train/*", "eval/*", "checkpoint/*")
PROBE_STEP_METRIC = "probe_tokens"
"""The probe curves' x-axis: the tokens seen by the step probed. A probe's row comes in after its step
(it runs beside the training: pipeline/probe/live.py), and wandb takes no row for a step before
the latest, so it joins the latest step logged and carries its own tokens here."""


class WandbRun:
    """The rank-0 wandb run of a training run (nothing for ``mode=disabled``), ``job_type`` train in
    the group ``settings.group``, its curves against :data:`STEP_METRIC`, its summary the best
    held-out perplexity and its ratios to the baselines (``best/*``: what a dashboard sorts runs by),
    each probe of ``probe_every`` also as a table and a chart; the shards it reads are its input
    artifact, its export its output (:meth:`use`, :meth:`produce`).

    ``settings``: the ``WandbConfig``; ``wandb_id``: the run's id from ``run.json``; ``writes``:
    the run's records queue (``run_dir.RunWriter``), which carries the copies to an s3 run directory;
    wandb's system charts are on (GPU utilisation, memory and power on GPUs; CPU, memory, disk and
    network everywhere): their sampling costs no measurable CPU (docs/outputs.md#the-dashboard).
    """

    def __init__(
        self,
        settings: Any,
        run_dir: str,
        name: str,
        config: dict,
        wandb_id: str,
        writes: WriteQueue,
    ):
        self.run_dir, self.writes = run_dir, writes
        self.run = None
        self.best: float | None = None
        self.last_step, self.probed_at = 0, -1  # the latest step logged, and a probe's
        self.files: OfflineCopy | None = None
        mode = settings.mode
        self.offline = mode is WandbMode.offline
        if mode is WandbMode.disabled:
            return
        self.run, self.files = start_run(
            settings,
            RunDir(run_dir).wandb,
            name=name,
            id=wandb_id,
            job_type="train",
            # offline runs cannot resume (each attempt is a directory of its own, synced with --id)
            resume="allow" if mode is WandbMode.online else None,
            config=config,
            system_stats=True,
        )
        for metric in (STEP_METRIC, PROBE_STEP_METRIC):
            self.run.define_metric(metric)
        for curve in CURVES:
            self.run.define_metric(curve, step_metric=STEP_METRIC)
        self.run.define_metric("probe/*", step_metric=PROBE_STEP_METRIC)

    def log(self, row: dict, step: int) -> None:
        if self.run is None:
            return
        values = _values(row)
        self.run.log(values, step=step)
        self.last_step = max(self.last_step, step)
        perplexity = row.get("eval/perplexity")
        if perplexity is not None and (self.best is None or perplexity < self.best):
            self.best = perplexity
            self.run.summary.update(best_summary(row))

    def log_probe(self, row: dict, table: tuple[list[str], list[list]], chart: bytes) -> None:
        """A live probe's ``row`` (kind ``probe``), with its ``table`` (``probe/table``, a
        ``wandb.Table``) and ``chart`` (``probe/plot``). It joins the latest step logged (see
        PROBE_STEP_METRIC): two probes can finish between two logged steps (the run's last two),
        and the second then takes the next step, or it would replace the first."""
        if self.run is None:
            return
        step = self.last_step + (self.probed_at == self.last_step)
        self.probed_at = self.last_step = step
        values = _values(row)
        values[PROBE_STEP_METRIC] = values.pop(STEP_METRIC)
        pictures = media({"probe/table": table}, {"probe/plot": chart}, caption=f"step {row['step']}")
        self.run.log({**values, **pictures}, step=step)

    def use(self, artifact: OutputArtifact) -> None:
        """Mark an output the run reads (its shards, a model it continues) as its input."""
        if self.run is not None:
            use_input(self.run, artifact, self.offline)

    def produce(self, artifact: OutputArtifact) -> None:
        """Log an output of the run (its export) as a reference artifact."""
        if self.run is not None:
            log_output(self.run, artifact)

    def upload(self) -> None:
        """Queue a copy of the offline files written since the last copy to ``RUN/wandb/attempt-NNN``
        (s3 run directories only: a local run directory holds them already), so the training loop
        does not wait for the storage; an earlier copy's error is raised here."""
        if self.files is not None:
            self.writes.submit(self.files.copy_new, latest="wandb")

    def finish(self) -> None:
        """End the wandb run; an s3 run directory then gets the last files (queued: the run's
        ``RunWriter.close()`` waits for them)."""
        if self.run is None:
            return
        end_run(self.run)
        self.run = None
        self.writes.submit(self.files.close)


def best_summary(row: dict) -> dict:
    """The run summary's ``best/*`` entries from the eval row of its best held-out perplexity: the
    perplexity, its step and tokens, and its ratio to each baseline the row carries."""
    ppl = row["eval/perplexity"]
    best = {"best/perplexity": ppl, "best/step": row["step"]}
    if STEP_METRIC in row:
        best["best/tokens"] = row[STEP_METRIC]
    for order in range(2, KNESER_NEY_MAX_ORDER + 1):
        if kneser_ney_metric(order) in row:
            best[f"best/perplexity_to_kneser_ney_{order}gram"] = ppl / row[kneser_ney_metric(order)]
    if UNIGRAM_METRIC in row:
        best["best/perplexity_to_unigram"] = ppl / row[UNIGRAM_METRIC]
    return best


def _values(row: dict) -> dict:
    """A row's numbers, as wandb takes them (the step apart)."""
    return {k: v for k, v in row.items() if isinstance(v, int | float) and k != "step"}
