"""Single-file mode: one HDF5 file exactly as AllenNLP's ``elmo`` command wrote it (docs/outputs.md#embeddings).

The job runs in sharded mode into ``<output>.parts`` (so it resumes like any other run), then this
module merges the shards in line order into one local temporary file, adds ``sentence_to_index``
(a JSON object {stripped sentence text: key}; a repeated sentence keeps its last key, as in
AllenNLP), and uploads it atomically. The index re-reads the input rather than storing texts twice;
it holds every sentence in memory, as AllenNLP's did: that is the format's cost, not the stage's.
After a successful merge the parts are deleted (unless ``keep_parts``), so a later rerun embeds again;
a run killed before the merge resumes from its parts.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence

import h5py

from pipeline.embed.errors import EmbedError
from pipeline.embed.file_format import format_named
from pipeline.embed.hdf5_shard import iter_shard, write_sentence_to_index
from pipeline.embed.inputs import ShardSpec, read_lines
from pipeline.embed.sentences import prepare_lines
from pipeline.runtime import storage

PARTS_SUFFIX = ".parts"


PARTS_FORMAT = format_named("hdf5")
"""The parts of a single file are HDF5 shards (the config refuses ``format=parquet`` for one)."""


def parts_path(output: str) -> str:
    """Where single-file mode keeps its shards while it runs."""
    return output + PARTS_SUFFIX


def merge(
    parts: str,
    specs: Sequence[ShardSpec],
    output: str,
    *,
    max_tokens: int,
    long_sentences: str,
    invalid_utf8: str,
    tokenize: Callable[[str], list[str]] = str.split,
) -> None:
    """Write ``output`` from the complete shards under ``parts`` (one shard in memory at a time)."""
    sentence_to_index: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="elmo-embed-merge-") as tmp:
        local = os.path.join(tmp, "embeddings.hdf5")
        with h5py.File(local, "w") as out:
            for spec in specs:
                prepared = prepare_lines(
                    read_lines(spec),
                    spec.first_line,
                    max_tokens=max_tokens,
                    long_sentences=long_sentences,
                    invalid_utf8=invalid_utf8,
                    where=spec.segments[0].path,
                    tokenize=tokenize,
                )
                expected = spec.first_line
                for line, value in iter_shard(PARTS_FORMAT.path(parts, spec.index)):
                    if line != expected:
                        raise EmbedError(
                            f"{PARTS_FORMAT.path(parts, spec.index)}: expected sentence {expected}, found {line}"
                        )
                    out.create_dataset(str(line), data=value)
                    expected += 1
                if expected != spec.first_line + spec.num_lines:
                    raise EmbedError(
                        f"{PARTS_FORMAT.path(parts, spec.index)}: holds lines up to {expected - 1}, expected {spec.first_line + spec.num_lines - 1}"
                    )
                for offset, text in enumerate(prepared.texts):
                    sentence_to_index[text] = str(spec.first_line + offset)
            write_sentence_to_index(out, sentence_to_index)
        try:
            storage.upload_file(local, output)
        except storage.StorageError as err:
            raise EmbedError(f"cannot write single-file output: {err}") from None


def delete_parts(parts: str) -> None:
    """Remove the parts folder's files (after a successful merge)."""
    for path in storage.list_prefix(parts.rstrip("/") + "/"):
        storage.delete(path)
    if not storage.is_s3(parts):
        for root, dirs, _files in os.walk(parts, topdown=False):
            for name in dirs:
                os.rmdir(os.path.join(root, name))
        if os.path.isdir(parts):
            os.rmdir(parts)
