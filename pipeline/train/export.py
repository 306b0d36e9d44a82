"""Export a trained biLM in the original format: options.json + weights.hdf5 (bilm-tf / AllenNLP
readable, via ``BiLM.save_files``), the softmax in its own HDF5, and the vocabulary.

Layout of ``OUT/``: ``options.json``, ``weights.hdf5``, ``softmax.hdf5`` (datasets ``softmax/W``
(V, P) and ``softmax/b`` (V,), bilm-tf's ``lm/softmax/{W,b}``), ``vocab.txt``.
"""

from __future__ import annotations

import os
import tempfile

import h5py
import numpy as np
import torch

from elmo_model import BiLM, OptionsError
from pipeline import storage
from pipeline.train import checkpoint as ckpt
from pipeline.train.objective import SharedSoftmax

EXPORT_DIR = "export"
"""The export's directory inside a run directory."""
OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"
SOFTMAX_FILE = "softmax.hdf5"
VOCAB_FILE = "vocab.txt"


def write_softmax(softmax: SharedSoftmax, path: str) -> None:
    """Write softmax W (V, P) and b (V,) as float32 to a local HDF5 file."""
    with h5py.File(path, "w") as f:
        f.create_dataset("softmax/W", data=softmax.weight.detach().float().cpu().numpy())
        f.create_dataset("softmax/b", data=softmax.bias.detach().float().cpu().numpy())


def read_softmax(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(W (V, P), b (V,)) from a local softmax HDF5 file."""
    with h5py.File(path, "r") as f:
        if "softmax/W" not in f or "softmax/b" not in f:
            raise ValueError(f"{path}: not a softmax file (needs datasets softmax/W and softmax/b)")
        return f["softmax/W"][...], f["softmax/b"][...]


def export_model(bilm: BiLM, softmax: SharedSoftmax, vocab: bytes, out_dir: str) -> list[str]:
    """Write the four export files to ``out_dir`` (local or ``s3://``); returns their paths."""
    written = []
    with tempfile.TemporaryDirectory(prefix="elmo-export-") as tmp:
        local = {
            name: os.path.join(tmp, name) for name in (OPTIONS_FILE, WEIGHTS_FILE, SOFTMAX_FILE, VOCAB_FILE)
        }
        bilm.save_files(local[OPTIONS_FILE], local[WEIGHTS_FILE])
        write_softmax(softmax, local[SOFTMAX_FILE])
        with open(local[VOCAB_FILE], "wb") as f:
            f.write(vocab)
        for name, path in local.items():
            target = storage.join(out_dir, name)
            storage.upload_file(path, target)
            written.append(target)
    return written


def model_from_checkpoint(path: str) -> tuple[BiLM, SharedSoftmax, dict]:
    """The BiLM (eval mode) and softmax held by checkpoint ``path``, and its model payload."""
    payload = ckpt.load_model(path)
    try:
        bilm = BiLM(payload["options"])
    except OptionsError as err:
        raise ckpt.CheckpointError(f"checkpoint {path}: {err}") from None
    bilm.load_state_dict(payload["bilm"])
    weight = payload["softmax"]["weight"]
    softmax = SharedSoftmax(weight.shape[0], weight.shape[1])
    softmax.load_state_dict(payload["softmax"])
    return bilm.eval(), softmax, payload


def export_checkpoint(path: str, out_dir: str) -> list[str]:
    """``elmo export CHECKPOINT OUT``: a checkpoint directory (or a run directory: its latest
    checkpoint) exported to ``out_dir``."""
    if not storage.exists(storage.join(path, ckpt.MODEL_FILE)):
        latest = ckpt.latest_checkpoint(path)
        if latest is None:
            raise ckpt.CheckpointError(f"{path}: neither a checkpoint nor a run directory with checkpoints")
        path = latest
    bilm, softmax, payload = model_from_checkpoint(path)
    with torch.no_grad():
        return export_model(bilm, softmax, payload["vocab"], out_dir)
