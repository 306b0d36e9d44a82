"""Locating, checking, fingerprinting and loading a trained biLM, and the device it runs on: one
implementation for every stage that reads a model (embed and its ``ElmoEmbedder``, probe, and
train's ``init_from`` and export).

A model is ``options.json`` + ``weights.hdf5`` in one folder (what training exports), or the two
files named one by one; either may be local or on S3. Both are checked to exist and the options
parsed before any work starts (one line naming the file otherwise, in the caller's error class);
:func:`resolve_model` also hashes both files, so the embed manifest records exactly which model
made the vectors (and a rerun with another model cannot mix its vectors into the same output).
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from elmo_model.options import BiLMOptions, OptionsError
from pipeline.errors import PipelineError
from pipeline.runtime import storage

if TYPE_CHECKING:  # torch loads with the model, not with a stage's config (which names Device)
    import torch

    from elmo_model import BiLM

OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"
"""A model folder's two files: what training exports (with its softmax and vocabulary beside them,
``pipeline/train/export.py``), what ``model=DIR`` names and ``init_from`` continues from."""


@dataclass(frozen=True)
class ModelSource:
    """Where the model is and what it is: ``sha256`` over both files, ``num_layers`` = N+1,
    ``output_dim`` = 2P, ``cell_dim`` = C (the LSTM's cells: what a pass's memory grows with)."""

    options_file: str
    weights_file: str
    sha256: str
    num_layers: int
    output_dim: int
    cell_dim: int

    def to_dict(self) -> dict:
        return asdict(self)


class Device(enum.Enum):
    auto = "auto"
    """A GPU when this process sees one, else the CPU."""
    cuda = "cuda"
    cpu = "cpu"


def pick_device(name: Device | str) -> torch.device:
    """The torch device for ``name`` (``auto``: cuda when this process sees a GPU, else cpu)."""
    import torch

    name = Device(name)
    if name is Device.auto:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name.value)


def model_paths(
    model: str, options_file: str, weights_file: str, error: type[PipelineError] = PipelineError
) -> tuple[str, str]:
    """The two file paths from ``--model DIR`` or ``--options F --weights F``."""
    if model and (options_file or weights_file):
        raise error("give either model=DIR or options_file + weights_file, not both")
    if model:
        return storage.join(model, OPTIONS_FILE), storage.join(model, WEIGHTS_FILE)
    if not (options_file and weights_file):
        raise error(
            "no model given: pass --model DIR (with options.json + weights.hdf5) or --options F --weights F"
        )
    return options_file, weights_file


def check_files(
    options_path: str, weights_path: str, model: str = "", error: type[PipelineError] = PipelineError
) -> None:
    """``error`` naming the file when either model file is missing or unreachable."""
    for role, path in (("options file", options_path), ("weights file", weights_path)):
        try:
            present = storage.exists(path)
        except storage.StorageError as err:
            raise error(f"model {role}: {err}") from None
        if not present:
            where = f" in model folder {model}" if model else ""
            raise error(f"model {role} {path} does not exist{where}")


def resolve_model(
    model: str, options_file: str, weights_file: str, error: type[PipelineError] = PipelineError
) -> ModelSource:
    """Check the model files exist and the options parse; hash them. ``error`` naming the file otherwise."""
    options_path, weights_path = model_paths(model, options_file, weights_file, error)
    check_files(options_path, weights_path, model, error)
    raw_options = _read(options_path, error)
    options = parse_options(raw_options, options_path, error)
    digest = hashlib.sha256(raw_options)
    digest.update(b"\0")
    try:
        storage.hash_into(digest, weights_path)
    except storage.StorageError as err:
        raise error(f"model: {err}") from None
    return ModelSource(
        options_path,
        weights_path,
        digest.hexdigest(),
        options.n_layers + 1,
        2 * options.projection_dim,
        options.dim,
    )


def read_options(options_path: str, error: type[PipelineError] = PipelineError) -> BiLMOptions:
    """A model's options file, parsed and checked; ``error`` naming the file otherwise."""
    return parse_options(_read(options_path, error), options_path, error)


def parse_options(raw: bytes, options_path: str, error: type[PipelineError] = PipelineError) -> BiLMOptions:
    """``raw``, the bytes of the options file at ``options_path``, as checked options."""
    try:
        return BiLMOptions.from_dict(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise error(f"model options file {options_path} is not valid JSON ({err})") from None
    except OptionsError as err:
        raise error(f"model options file {options_path}: {err}") from None


def _read(path: str, error: type[PipelineError]) -> bytes:
    try:
        return storage.read_bytes(path)
    except storage.StorageError as err:
        raise error(f"model: {err}") from None


def load_bilm(source: ModelSource, error: type[PipelineError] = PipelineError) -> BiLM:
    """``source``'s biLM (see :func:`load_files`)."""
    return load_files(source.options_file, source.weights_file, error)


def load_files(options_file: str, weights_file: str, error: type[PipelineError] = PipelineError) -> BiLM:
    """The biLM in eval mode, float32, stateless (S3 files downloaded to a temp folder first);
    ``error``, one line naming the file, for files that are missing or do not load."""
    with tempfile.TemporaryDirectory(prefix="elmo-model-") as tmp:
        local = []
        for path, name in ((options_file, OPTIONS_FILE), (weights_file, WEIGHTS_FILE)):
            try:
                if storage.is_s3(path):
                    target = os.path.join(tmp, name)
                    storage.download_file(path, target)
                    path = target
            except storage.StorageError as err:
                raise error(f"model: {err}") from None
            local.append(path)
        from elmo_model import BiLM  # torch: here, with the model

        try:
            return BiLM.from_files(*local)
        except OptionsError as err:
            raise error(f"model options file {options_file}: {err}") from None
        except Exception as err:  # h5py/KeyError/shape errors: name the file, one line
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise error(f"model weights {weights_file}: cannot load ({first})") from None
