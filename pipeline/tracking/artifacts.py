"""A stage's output as a wandb reference artifact, and the lineage between them.

Nothing is uploaded: an artifact references its files where they are (``file://`` or ``s3://``).
Its digest is over the files it checksums (``checked``: a manifest, small files; md5 locally, the
ETag on S3) and the paths of those it only lists (``listed``: the shards, which the manifest names
with their sha256s), so a rerun that writes nothing new gives the same digest, which wandb keeps as
the same version. The stages' outputs: the shard folder (type ``dataset``), the export (``model``),
the embeddings (``embeddings``) and the probe's report (``probe-report``). A stage logs its output
(:func:`log_output`) and marks the outputs it read as its inputs (:func:`use_input`), so the
lineage graph reads shards -> train -> model -> embed / probe.

Names come from the output's place, the last three parts of its path (``runs/demo/shards`` ->
``runs-demo-shards``, ``runs/demo/train/export`` -> ``demo-train-export``), so the stage that reads
an output names it as the one that wrote it did.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.formats.shard_format import SPLITS
from pipeline.formats.shard_manifest import ShardManifest
from pipeline.runtime import storage

_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class OutputArtifact:
    """An output as a reference artifact: ``name``, ``type``; ``checked``: paths (local or
    ``s3://``) whose content enters the digest; ``listed``: paths that enter it by name alone;
    ``metadata``: facts shown beside it (not in the digest)."""

    name: str
    type: str
    checked: tuple[str, ...]
    listed: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)

    def build(self):
        """The ``wandb.Artifact`` (each entry named by its file name)."""
        import wandb

        artifact = wandb.Artifact(self.name, type=self.type, metadata=self.metadata)
        for paths, checksum in ((self.checked, True), (self.listed, False)):
            for path in paths:
                artifact.add_reference(_uri(path), name=path.rsplit("/", 1)[-1], checksum=checksum)
        return artifact


def _uri(path: str) -> str:
    return path if storage.is_s3(path) else "file://" + os.path.abspath(path)


def artifact_name(folder: str) -> str:
    """The artifact name of the output at ``folder``: its last three path parts (``runs-demo-shards``)."""
    parts = [
        p
        for p in re.split(r"[/\\]+", os.path.abspath(folder) if not storage.is_s3(folder) else folder[5:])
        if p
    ][-3:]
    return _NOT_IN_NAME.sub("_", "-".join(parts)) or "output"


def dataset_artifact(manifest: ShardManifest) -> OutputArtifact:
    """The shard stage's output: its manifest and vocabulary checked, its shards listed; each
    split's totals and the vocabulary's size as metadata."""
    totals = {
        split: {k: v for k, v in asdict(manifest.totals[split]).items() if v is not None}
        | {"unk_rate": manifest.totals[split].unk_rate}
        for split in SPLITS
    }
    return OutputArtifact(
        artifact_name(manifest.folder),
        "dataset",
        checked=(manifest.path, manifest.vocab_path),
        listed=tuple(url for split in SPLITS for url in manifest.urls(split)),
        metadata=totals | {"vocab_size": manifest.vocab.size},
    )


def model_artifact(options_file: str, weights_file: str) -> OutputArtifact:
    """A biLM (``options.json`` + ``weights.hdf5``, both checked), named by the weights' folder."""
    folder = weights_file.replace("\\", "/").rsplit("/", 1)[0] if "/" in weights_file else "."
    return OutputArtifact(artifact_name(folder), "model", checked=(options_file, weights_file))


def log_output(run, artifact: OutputArtifact) -> None:
    """Log ``artifact`` as the output of ``run`` (a wandb run)."""
    with _logged(artifact):
        run.log_artifact(artifact.build())


def use_input(run, artifact: OutputArtifact, offline: bool) -> None:
    """Mark ``artifact`` as an input of ``run``. Online that is ``use_artifact``. wandb 0.31 refuses
    ``use_artifact`` offline, so an offline run records what ``use_artifact`` itself sends for an
    artifact it has not seen logged: the artifact, to be used once committed. ``wandb sync`` replays
    it; the producer's version has the same digest, so it becomes that version's use."""
    with _logged(artifact):
        built = artifact.build()
        if offline:
            run._log_artifact(built, is_user_created=True, use_after_commit=True)
        else:
            run.use_artifact(built)


@contextmanager
def _logged(artifact: OutputArtifact) -> Iterator[None]:
    """Around logging ``artifact``: where its files cannot be checksummed (an S3 endpoint wandb's
    own client does not reach), one line says so and the run goes on without it."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - the dashboard's lineage never fails a stage
        print(
            f"wandb: artifact {artifact.name} not logged: {' '.join(str(err).split())[:300]}", file=sys.stderr
        )
