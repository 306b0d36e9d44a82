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

    ``job_type``: the stage (``shard``, ``embed``, ``probe``); ``name``: the run's name;
    ``config``: the stage's settings as plain containers (``pipeline.config.to_dict``: credentials
    redacted); ``summary``: its totals, scalars by name; ``tables``: name -> (columns, rows), each a
    ``wandb.Table``; ``images``: name -> PNG bytes, each a ``wandb.Image``; ``uses``: the outputs
    it read, ``produces``: its own (reference artifacts, ``pipeline/tracking/artifacts.py``).
    """

    job_type: str
    name: str
    config: dict
    summary: dict[str, float | int | str]
    tables: dict[str, tuple[list[str], list[list[Any]]]] = field(default_factory=dict)
    images: dict[str, bytes] = field(default_factory=dict)
    uses: tuple[OutputArtifact, ...] = ()
    produces: OutputArtifact | None = None


def log_stage_run(settings: WandbConfig, output: str, log: StageLog) -> str | None:
    """Log ``log`` as one wandb run (nothing for ``wandb.mode=disabled``), its offline files under
    ``output``'s ``wandb/`` (local or ``s3://``). Returns the offline run's sync command, else None."""
    mode = settings.mode
    if mode is WandbMode.disabled:
        return None
    if mode is WandbMode.online:
        check_credentials()
    import wandb
    from PIL import Image

    folder = storage.join(output, WANDB_DIR)
    files = OfflineCopy(next_attempt(folder))
    wandb_id = new_wandb_id()
    # a wandb service inherited through the environment would outlive this run (see train's run)
    os.environ.pop("WANDB_SERVICE", None)
    try:
        run = wandb.init(
            mode=mode.value,
            dir=files.local,
            project=settings.project,
            entity=settings.entity or None,
            name=log.name,
            id=wandb_id,
            group=settings.group or None,
            job_type=log.job_type,
            config=log.config,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )
        media: dict[str, Any] = {
            name: wandb.Table(columns=columns, data=rows) for name, (columns, rows) in log.tables.items()
        }
        media.update({name: wandb.Image(Image.open(io.BytesIO(png))) for name, png in log.images.items()})
        if media:
            run.log(media)
        run.summary.update(log.summary)
        for artifact in log.uses:
            with artifact_logged(artifact):
                use_input(run, artifact, offline=mode is WandbMode.offline)
        if log.produces is not None:
            with artifact_logged(log.produces):
                log_output(run, log.produces)
        run.finish()
    finally:
        # wandb's process-wide state (its service, a login) would outlive the run
        wandb.teardown()
        files.close()
    return (
        sync_command(folder, wandb_id, settings.project, settings.entity)
        if mode is WandbMode.offline
        else None
    )
