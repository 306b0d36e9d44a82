"""The wandb run of a one-shot stage (shard, embed, probe), logged once the stage's work is done.

A pipeline's stages are runs of one wandb group (``wandb.group``; ``elmo pipeline`` sets its name),
each with its ``job_type``. The train stage logs as it goes (``pipeline/train/wandb_run.py``); the
other stages are one pass each, so their run holds what a dashboard compares them by: the stage's
totals as the run's summary, its tables (``wandb.Table``) and its pictures. A rerun that did no
work logs no run. The offline files go to ``OUTPUT/wandb/attempt-NNN/``
(``pipeline/tracking/offline_files.py``), and the stage's summary prints the sync command.
"""

from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from pipeline.runtime import storage
from pipeline.tracking.artifacts import OutputArtifact, artifact_logged, log_output, use_input
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
        if self.settings.mode is WandbMode.online:
            check_credentials()
        import wandb

        self._files = OfflineCopy(next_attempt(storage.join(self.output, WANDB_DIR)))
        # a wandb service inherited through the environment would outlive this run (see train's run)
        os.environ.pop("WANDB_SERVICE", None)
        self.run = wandb.init(
            mode=self.settings.mode.value,
            dir=self._files.local,
            project=self.settings.project,
            entity=self.settings.entity or None,
            name=run_name(self.settings, self.job_type),
            id=self._id,
            group=self.settings.group or None,
            job_type=self.job_type,
            config=self.config,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=not self.system_stats),
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
        import wandb
        from PIL import Image

        _media_folder()
        media: dict[str, Any] = {
            name: wandb.Table(columns=columns, data=rows) for name, (columns, rows) in log.tables.items()
        }
        media.update({name: wandb.Image(Image.open(io.BytesIO(png))) for name, png in log.images.items()})
        if media:
            self.run.log(media)
        self.run.summary.update(log.summary)
        for artifact in log.uses:
            with artifact_logged(artifact):
                use_input(self.run, artifact, offline=self.settings.mode is WandbMode.offline)
        if log.produces is not None:
            with artifact_logged(log.produces):
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
        import wandb

        try:
            self.run.finish(exit_code=exit_code)
        finally:
            self.run = None
            # wandb's process-wide state (its service, a login) would outlive the run
            wandb.teardown()
            self._files.close()


def log_stage_run(settings: WandbConfig, output: str, log: StageLog) -> str | None:
    """Log ``log`` as one wandb run (nothing for ``wandb.mode=disabled``), its offline files under
    ``output``'s ``wandb/`` (local or ``s3://``). Returns the offline run's sync command, else None."""
    return StageRun(settings, output, log.job_type, log.config).finish(log)
