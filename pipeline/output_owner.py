"""Who owns an output folder: one rule for every stage.

A stage writes only into a folder (or ``s3://`` prefix) that is new, empty, or its own. Its own
means: the folder holds the stage's *marker* (the file the stage writes before anything else,
naming the run: ``run.json`` for train, ``_progress/run.json`` for embed, ``shard_run.json`` for
shard, ``export.json`` for an export) and nothing but files the stage writes. A folder of anyone
else's files, or of files that look like the stage's but without its marker (a user's
``vocab_counts.tsv``, released ``options.json`` + ``weights.hdf5``), is refused in one line naming
a file, never written over; whether a marked folder holds this very run (the same settings and
data) is each stage's own check of the marker's content, read through ``read_marker``: a JSON
object naming the stage (``"stage"``) and the run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pipeline import storage
from pipeline.errors import PipelineError


@dataclass(frozen=True)
class OwnFiles:
    """What stage ``stage`` writes into its output: ``marker`` (a relative path, written first) and
    ``pattern``, which every relative path (``/``-separated) of its files matches."""

    stage: str
    marker: str
    pattern: re.Pattern[str]


def check_owned(folder: str, own: OwnFiles, error: type[PipelineError], overwrite_hint: str = "") -> bool:
    """Whether ``folder`` holds ``own.stage``'s earlier output (its marker); False when it is new or
    empty. ``error`` (one line) for anything else. ``overwrite_hint``: how the stage lets a user
    write into such a folder anyway (its ``--overwrite``), said in the message; none by default."""
    way_out = f"choose an empty or new output folder{overwrite_hint}"
    if storage.is_file(folder):  # refused before any work, not when the first file is written
        raise error(f"output {folder} is a file, not a folder; {way_out}")
    links = storage.folder_links_out(folder)
    if links:  # not listed below, and a run would write through one into someone else's folder
        raise error(
            f"output {folder} holds {links[0]}, a link to a folder outside it (a run would write "
            f"through it); {way_out}"
        )
    names = storage.list_names(folder)
    if not names:
        return False
    foreign = [name for name in names if not own.pattern.fullmatch(name)]
    if foreign:
        raise error(f"output {folder} holds {foreign[0]}, which elmo {own.stage} did not write; {way_out}")
    if own.marker not in names:
        raise error(
            f"output {folder} holds {names[0]} but no {own.marker}: not an elmo {own.stage} output "
            f"(or one from before {own.marker} was written); {way_out}"
        )
    return True


def withdraw_claim(folder: str, own: OwnFiles) -> None:
    """After a run failed: delete its marker when that is all the folder holds (the run wrote
    nothing else), so a rerun with corrected settings is not refused as another run's. A storage
    error here is swallowed: the run's own error matters more, and the claim only stays behind."""
    try:
        if storage.list_names(folder) == [own.marker]:
            storage.delete(storage.join(folder, own.marker))
    except storage.StorageError:
        pass


def read_marker(folder: str, own: OwnFiles, error: type[PipelineError]) -> dict:
    """The marker of a folder ``check_owned`` found to be ``own.stage``'s: a JSON object whose
    ``"stage"`` is that stage (markers written before the key was added have none). ``error``, one
    line, for anything else (``{}``-like damage is the stage's own check of the object's fields)."""
    path = storage.join(folder, own.marker)
    try:
        data = json.loads(storage.read_bytes(path))
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict) or data.get("stage", own.stage) != own.stage:
        raise error(
            f"{path} is not an elmo {own.stage} marker (a JSON object naming the run that wrote the "
            f"folder): restore it from a copy, or choose another output"
        )
    return data
