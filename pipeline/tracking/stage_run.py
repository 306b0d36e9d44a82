"""The wandb run of a one-shot stage (shard, embed, probe), logged once the stage's work is done.

A pipeline's stages are runs of one wandb group (``wandb.group``; ``elmo pipeline`` sets its name),
each with its ``job_type``. The train stage logs as it goes (``pipeline/train/wandb_run.py``); the
other stages are one pass each, so their run holds what a dashboard compares them by: the stage's
totals as the run's summary, its tables (``wandb.Table``) and its pictures. A rerun that did no
work logs no run. The offline files go to ``OUTPUT/wandb/attempt-NNN/``
(``pipeline/tracking/offline_files.py``), and the stage's summary prints the sync command.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from pipeline.runtime import storage
from pipeline.tracking.artifacts import OutputArtifact, log_output, use_input
from pipeline.tracking.config import WandbConfig, WandbMode
from pipeline.tracking.offline_files import WANDB_DIR, OfflineCopy, new_wandb_id, next_attempt, sync_command


def check_credentials() -> None:
    """Online mode needs credentials: ``WANDB_API_KEY`` or those ``wandb login`` saved."""
    import wandb

    if not wandb.login(prompt=False, verify=False):
        raise ValueError(
            "wandb.mode=online needs credentials: set WANDB_API_KEY or run `wandb login`; "
            "or use wandb.mode=offline"
        )


def start_run(
    settings: WandbConfig, folder: str, *, system_stats: bool, **init: Any
) -> tuple[Any, OfflineCopy]:
    """A wandb run of ``settings`` (not ``disabled``) whose files go to a new attempt under
    ``folder`` (an output's ``wandb/``), and that attempt's ``OfflineCopy``. ``init``: the rest of
    ``wandb.init``'s arguments (name, id, job_type, config ...); ``system_stats``: wandb's system
    charts (their sampling costs no measurable CPU: ``benchmarks/wandb_stats.py``)."""
    if settings.mode is WandbMode.online:
        check_credentials()
    import wandb

    files = OfflineCopy(next_attempt(folder))
    # a wandb service inherited through the environment (a driver or a test process that ran wandb
    # before starting Ray) would hold the streams of every run: a killed run's stream would then
    # keep the run's id "in use" for the next. Each run's process starts its own.
    os.environ.pop("WANDB_SERVICE", None)
    with _service_logs_in(files.local):
        run = wandb.init(
            mode=settings.mode.value,
            dir=files.local,
            project=settings.project,
            entity=settings.entity or None,
            group=settings.group or None,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=not system_stats),
            **init,
        )
    return run, files


SERVICE_LOGS = "service"
"""Where in an attempt's folder wandb's service writes its own logs (``wandb/logs/core-debug-*.log``)."""


@contextlib.contextmanager
def _service_logs_in(folder: str):
    """wandb's service (``wandb-core``, started by ``wandb.init``) writes a debug log per start
    under ``WANDB_CACHE_DIR`` (``~/.cache``) that nothing removes, and the run's ``debug-core.log``
    links to it. Unless the user chose a cache folder, the service starts with its cache in the
    run's own folder, so its log is one of the run's files, kept and removed with them."""
    if "WANDB_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["WANDB_CACHE_DIR"] = os.path.join(folder, SERVICE_LOGS)
    try:
        yield
    finally:
        os.environ.pop("WANDB_CACHE_DIR", None)


def end_run(run, exit_code: int = 0) -> None:
    """Finish ``run``, then end wandb's process-wide state (its service, the session's login),
    which would outlive the run: a later run in this process would inherit another's credentials."""
    import wandb

    try:
        run.finish(exit_code=exit_code)
    finally:
        wandb.teardown()


def media(
    tables: dict[str, tuple[list[str], list[list[Any]]]], images: dict[str, bytes], caption: str = ""
) -> dict:
    """``tables`` (name -> (columns, rows)) as ``wandb.Table``s and ``images`` (name -> PNG bytes)
    as ``wandb.Image``s, for one ``run.log``."""
    import wandb
    from PIL import Image

    _media_folder()
    values: dict[str, Any] = {
        name: wandb.Table(columns=columns, data=rows) for name, (columns, rows) in tables.items()
    }
    values.update(
        {
            name: wandb.Image(Image.open(io.BytesIO(png)), caption=caption or None)
            for name, png in images.items()
        }
    )
    return values


@dataclass
class StageLog:
    """What a stage puts on the dashboard.

    ``job_type``: the stage (``shard``, ``embed``, ``probe``; the run's name is ``GROUP-job_type``);
    ``config``: the stage's settings as plain containers (``pipeline.config.to_dict``: credentials
    redacted); ``summary``: its totals, scalars by name; ``tables``: name -> (columns, rows), each a
    ``wandb.Table``; ``images``: name -> PNG bytes, each a ``wandb.Image``; ``uses``: the outputs
    it read, ``produces``: its own (reference artifacts, ``pipeline/tracking/artifacts.py``).
    """

    job_type: str
    config: dict
    summary: dict[str, float | int | str]
    tables: dict[str, tuple[list[str], list[list[Any]]]] = field(default_factory=dict)
    images: dict[str, bytes] = field(default_factory=dict)
    uses: tuple[OutputArtifact, ...] = ()
    produces: OutputArtifact | None = None


_media: tempfile.TemporaryDirectory | None = None


def _media_folder() -> None:
    """wandb first writes a logged table or image into a folder it makes once, when imported
    (``wandb.sdk.data_types._private.MEDIA_TMP``). Imported inside an embedded Ray session, that
    folder is in the session's own temporary folder, which goes with the session
    (``pipeline/runtime/ray_runtime.py``), so a run after it (``elmo pipeline``'s probe) could log
    no table: such a run gets a folder of its own in the temporary folder of now."""
    global _media
    from wandb.sdk.data_types import _private

    if not os.path.isdir(_private.MEDIA_TMP.name):
        _media = tempfile.TemporaryDirectory("wandb-media")
        _private.MEDIA_TMP.name = _media.name


def run_name(settings: WandbConfig, stage: str) -> str:
    """A stage's run name: ``GROUP-stage`` in a group, else the stage."""
    return f"{settings.group}-{stage}" if settings.group else stage


class StageRun:
    """A one-shot stage's wandb run into ``output``'s ``wandb/``, started by its first :meth:`log`
    or by :meth:`finish` (so a rerun with nothing to do, which calls neither, leaves no run).
    ``system_stats``: wandb's system charts (GPU utilisation, memory, power; CPU and memory), for a
    stage that logs as it goes (embed); a run logged once its work is done has nothing to chart."""

    def __init__(self, settings: WandbConfig, output: str, job_type: str, config: dict):
        self.settings, self.output, self.job_type, self.config = settings, output, job_type, config
        self.system_stats = False
        self.run = None
        self._files: OfflineCopy | None = None
        self._id = new_wandb_id()

    @property
    def enabled(self) -> bool:
        return self.settings.mode is not WandbMode.disabled

    def _start(self) -> None:
        if self.run is not None or not self.enabled:
            return
        self.run, self._files = start_run(
            self.settings,
            storage.join(self.output, WANDB_DIR),
            name=run_name(self.settings, self.job_type),
            id=self._id,
            job_type=self.job_type,
            config=self.config,
            system_stats=self.system_stats,
        )

    def log(self, row: dict[str, float | int]) -> None:
        """One row of the stage's progress (its curves), starting the run at the first."""
        if self.enabled:
            self._start()
            self.run.log(row)

    def finish(self, log: StageLog) -> str | None:
        """Log the stage's summary, tables, pictures and artifacts, end the run; its sync command
        when offline, else None."""
        if not self.enabled:
            return None
        self._start()
        if log.tables or log.images:
            self.run.log(media(log.tables, log.images))
        self.run.summary.update(log.summary)
        for artifact in log.uses:
            use_input(self.run, artifact, offline=self.settings.mode is WandbMode.offline)
        if log.produces is not None:
            log_output(self.run, log.produces)
        self._end(0)
        folder = storage.join(self.output, WANDB_DIR)
        offline = self.settings.mode is WandbMode.offline
        return (
            sync_command(folder, self._id, self.settings.project, self.settings.entity) if offline else None
        )

    def abandon(self) -> None:
        """End a started run as failed (the stage raised)."""
        if self.run is not None:
            self._end(1)

    def _end(self, exit_code: int) -> None:
        try:
            end_run(self.run, exit_code)
        finally:
            self.run = None
            self._files.close()
