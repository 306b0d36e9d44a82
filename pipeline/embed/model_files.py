"""Locating, checking, fingerprinting and loading the model an embed job uses.

A model is ``options.json`` + ``weights.hdf5`` in one folder (what training exports), or the two
files named one by one; either may be local or on S3. The driver checks both exist and parses the
options before any work starts, and hashes both files so the manifest records exactly which model
made the vectors (and a rerun with another model cannot mix its vectors into the same output).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass

from elmo_model import BiLM, BiLMOptions, OptionsError
from pipeline import storage
from pipeline.embed.errors import EmbedError

OPTIONS_NAME = "options.json"
WEIGHTS_NAME = "weights.hdf5"


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


def model_paths(model: str, options_file: str, weights_file: str) -> tuple[str, str]:
    """The two file paths from ``--model DIR`` or ``--options F --weights F``."""
    if model and (options_file or weights_file):
        raise EmbedError("give either model=DIR or options_file + weights_file, not both")
    if model:
        return storage.join(model, OPTIONS_NAME), storage.join(model, WEIGHTS_NAME)
    if not (options_file and weights_file):
        raise EmbedError(
            "no model given: pass --model DIR (with options.json + weights.hdf5) or --options F --weights F"
        )
    return options_file, weights_file


def resolve_model(model: str, options_file: str, weights_file: str) -> ModelSource:
    """Check the model files exist and the options parse; hash them. EmbedError naming the file otherwise."""
    options_path, weights_path = model_paths(model, options_file, weights_file)
    for role, path in (("options file", options_path), ("weights file", weights_path)):
        try:
            present = storage.exists(path)
        except storage.StorageError as err:
            raise EmbedError(f"model {role}: {err}") from None
        if not present:
            where = f" in model folder {model}" if model else ""
            raise EmbedError(f"model {role} {path} does not exist{where}")
    try:
        raw_options = storage.read_bytes(options_path)
        options = BiLMOptions.from_dict(json.loads(raw_options.decode("utf-8")))
        digest = hashlib.sha256(raw_options)
        digest.update(b"\0")
        storage.hash_into(digest, weights_path)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EmbedError(f"model options file {options_path} is not valid JSON ({err})") from None
    except OptionsError as err:
        raise EmbedError(f"model options file {options_path}: {err}") from None
    except storage.StorageError as err:
        raise EmbedError(f"model: {err}") from None
    return ModelSource(
        options_path,
        weights_path,
        digest.hexdigest(),
        options.n_layers + 1,
        2 * options.projection_dim,
        options.dim,
    )


def load_bilm(source: ModelSource) -> BiLM:
    """The biLM in eval mode, float32, stateless (downloads S3 files to a temp folder first)."""
    with tempfile.TemporaryDirectory(prefix="elmo-embed-model-") as tmp:
        local = []
        for path, name in ((source.options_file, OPTIONS_NAME), (source.weights_file, WEIGHTS_NAME)):
            if storage.is_s3(path):
                target = os.path.join(tmp, name)
                storage.download_file(path, target)
                path = target
            local.append(path)
        try:
            return BiLM.from_files(*local)
        except Exception as err:  # h5py/KeyError/shape errors: name the file, one line
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise EmbedError(f"model weights {source.weights_file}: cannot load ({first})") from None
