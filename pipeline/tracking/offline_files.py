"""Where a wandb run's offline files live, and the command that uploads them.

A run's files belong with the output it describes: ``OUTPUT/wandb/attempt-NNN/`` (wandb's own
``wandb/offline-run-<time>-<id>`` below it; one directory per attempt, since wandb names its
directory to the second and cannot resume an offline run). ``wandb sync --id <id>`` uploads every
attempt into the one run, attempts in order (:func:`sync_command` prints the exact command). For an
``s3://`` output the files are written to a local temporary directory and copied up
(:class:`OfflineCopy`).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import tempfile

from pipeline.runtime import storage

WANDB_DIR = "wandb"
"""The folder of an output that holds its wandb runs' offline files."""
_ATTEMPT = re.compile(r"attempt-(\d+)$")
RUNS_PATTERN = rf"{WANDB_DIR}/attempt-\d{{3,}}/.+"
"""The relative paths of an output's wandb files, for a stage's own-files pattern
(``pipeline/output_folder.py``)."""


def new_wandb_id() -> str:
    """A fresh wandb run id (wandb's own alphabet: lowercase letters and digits)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(12))


def sync_command(folder: str, wandb_id: str, project: str, entity: str = "") -> str:
    """The shell command that uploads every offline attempt under ``folder`` (an output's
    ``wandb/``, local or ``s3://``) of the run ``wandb_id`` into one wandb run."""
    target = f"-p {shlex.quote(project)}" + (f" -e {shlex.quote(entity)}" if entity else "")
    runs = f"attempt-*/wandb/offline-run-*-{wandb_id}"
    if storage.is_s3(folder):
        local = f"{WANDB_DIR}-{wandb_id}"
        return (
            f"aws s3 cp --recursive {shlex.quote(folder)} ./{local} && "
            f"wandb sync --id {wandb_id} {target} ./{local}/{runs}"
        )
    return f"wandb sync --id {wandb_id} {target} {shlex.quote(folder)}/{runs}"


def _attempt_name(index: int) -> str:
    return f"attempt-{index:03d}"  # zero-padded: the sync command's glob lists attempts in order


def next_attempt(folder: str) -> str:
    """A new attempt's directory under ``folder`` (an output's ``wandb/``), one past the highest an
    earlier attempt left there. One writer of the output at a time runs this (its lease), so
    listing is enough; a local directory is created here."""
    if storage.is_s3(folder):
        names = {p[len(folder) + 1 :].split("/", 1)[0] for p in storage.list_prefix(folder + "/")}
    else:
        names = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    used = [int(m.group(1)) for name in names if (m := _ATTEMPT.match(name))]
    index = max(used, default=0) + 1
    if not storage.is_s3(folder):
        while True:  # exist_ok=False: a directory is claimed once
            try:
                os.makedirs(os.path.join(folder, _attempt_name(index)))
                break
            except FileExistsError:
                index += 1
    return storage.join(folder, _attempt_name(index))


class OfflineCopy:
    """The local directory wandb writes an attempt's files into: the attempt itself when it is
    local, else a temporary directory whose new files :meth:`copy_new` copies to ``attempt`` on S3."""

    def __init__(self, attempt: str):
        self.attempt = attempt
        self._tmp = tempfile.TemporaryDirectory(prefix="elmo-wandb-") if storage.is_s3(attempt) else None
        self.local = self._tmp.name if self._tmp else attempt
        self._copied: dict[str, tuple[int, int]] = {}  # local path -> (size, mtime_ns) copied

    def copy_new(self) -> None:
        """Copy the files written or changed since the last copy (nothing for a local attempt)."""
        if self._tmp is None:
            return
        for dirpath, _, files in os.walk(self.local):
            for name in files:
                full = os.path.join(dirpath, name)
                if os.path.islink(full):
                    continue
                try:
                    stat = os.stat(full)
                except FileNotFoundError:  # wandb rotated it meanwhile
                    continue
                seen = (stat.st_size, stat.st_mtime_ns)
                if self._copied.get(full) == seen:
                    continue
                storage.upload_file(full, storage.join(self.attempt, os.path.relpath(full, self.local)))
                self._copied[full] = seen

    def close(self) -> None:
        """Copy the last files, then remove the temporary directory."""
        try:
            self.copy_new()
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
