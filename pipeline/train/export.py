"""Export a trained biLM in the original format: options.json + weights.hdf5 (bilm-tf / AllenNLP
readable, via ``BiLM.save_files``), the softmax in its own HDF5, and the vocabulary.

Layout of ``OUT/``: ``export.json`` (``{"stage": "export", "run": RUN, ...}``: what was exported, the
run and step or the checkpoint; written first, it makes the folder an export's and is read before a
later export writes there, ``pipeline/output_folder.py``), ``options.json``,
``weights.hdf5``, ``softmax.hdf5`` (datasets ``softmax/W`` (V, P) and ``softmax/b`` (V,), bilm-tf's
``lm/softmax/{W,b}``), ``vocab.txt``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import h5py
import numpy as np
import torch

from elmo_model import BiLM, OptionsError
from elmo_model.hdf5_storage import require_stored_here
from pipeline.model_loader import OPTIONS_FILE, WEIGHTS_FILE, load_files, model_paths
from pipeline.output_folder import OwnFiles, check_owned, read_marker, taken_back_on_failure
from pipeline.runtime import storage
from pipeline.train import checkpoint as ckpt
from pipeline.train.errors import TrainError
from pipeline.train.objective import SharedSoftmax
from pipeline.train.run_dir import CHECKPOINTS

SOFTMAX_FILE = "softmax.hdf5"
VOCAB_FILE = "vocab.txt"
EXPORT_FILES = (OPTIONS_FILE, WEIGHTS_FILE, SOFTMAX_FILE, VOCAB_FILE)
MARKER_FILE = "export.json"
OWN_FILES = OwnFiles(
    "export", MARKER_FILE, re.compile("|".join(re.escape(n) for n in (MARKER_FILE, *EXPORT_FILES)))
)


def export_files(folder: str) -> tuple[str, str]:
    """The options and weights files of the export (or released model) in ``folder``."""
    return model_paths(folder, "", "", TrainError)


def write_softmax(softmax: SharedSoftmax, path: str) -> None:
    """Write softmax W (V, P) and b (V,) as float32 to a local HDF5 file."""
    with h5py.File(path, "w") as f:
        f.create_dataset("softmax/W", data=softmax.weight.detach().float().cpu().numpy())
        f.create_dataset("softmax/b", data=softmax.bias.detach().float().cpu().numpy())


def read_softmax(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(W (V, P), b (V,)) float32 from a local softmax HDF5 file, its datasets checked (stored in the
    file itself, float, shapes that agree) before use; a TrainError names the problem."""
    with h5py.File(path, "r") as f:
        for key in ("softmax/W", "softmax/b"):
            require_stored_here(f, key, path, TrainError)
            if not isinstance(f.get(key), h5py.Dataset) or f[key].dtype.kind != "f":
                raise TrainError(f"{path}: not a softmax file (needs float datasets softmax/W and softmax/b)")
        weight, bias = f["softmax/W"], f["softmax/b"]
        if weight.ndim != 2 or bias.shape != (weight.shape[0],):
            raise TrainError(
                f"{path}: softmax/W {weight.shape} and softmax/b {bias.shape} are not (V, P) and (V,)"
            )
        return weight[...].astype(np.float32), bias[...].astype(np.float32)


def export_model(bilm: BiLM, softmax: SharedSoftmax, vocab: bytes, out_dir: str, source: dict) -> list[str]:
    """Write the export to ``out_dir`` (local or ``s3://``): ``export.json`` (``source``: what was
    exported) first, then the four model files; returns their paths."""
    marker = {"stage": OWN_FILES.stage, **source}
    storage.write_bytes(storage.join(out_dir, MARKER_FILE), json.dumps(marker, sort_keys=True).encode())
    written = []
    with tempfile.TemporaryDirectory(prefix="elmo-export-") as tmp:
        local = {name: os.path.join(tmp, name) for name in EXPORT_FILES}
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
        with torch.device("meta"):  # shapes only: options that disagree with the tensors allocate nothing
            expected = BiLM(payload["options"]).state_dict()
    except OptionsError as err:
        raise ckpt.CheckpointError(f"checkpoint {path}: {err}") from None
    for key, tensor in expected.items():
        stored = payload["bilm"].get(key)
        if stored is None or tuple(stored.shape) != tuple(tensor.shape):
            found = "missing" if stored is None else f"of shape {tuple(stored.shape)}"
            raise ckpt.CheckpointError(
                f"checkpoint {path}: tensor '{key}' is {found}, but its options need shape {tuple(tensor.shape)}"
            )
    bilm = BiLM(payload["options"])
    bilm.load_state_dict(payload["bilm"])
    weight = payload["softmax"]["weight"]
    softmax = SharedSoftmax(weight.shape[0], weight.shape[1])
    softmax.load_state_dict(payload["softmax"])
    return bilm.eval(), softmax, payload


def load_pretrained(source: str, bilm: BiLM, softmax: SharedSoftmax, vocab: bytes) -> None:
    """Load an export at ``source`` (local or ``s3://``) into ``bilm``, and into ``softmax`` when the
    export has one for the same ``vocab`` (the contents of vocab.txt): continued pretraining
    (``init_from``). The model is read by the model loader, as embed and probe read one (its files
    checked as any untrusted HDF5)."""
    loaded = load_files(*export_files(source), TrainError)
    bilm.load_state_dict(loaded.state_dict())
    softmax_path, vocab_path = storage.join(source, SOFTMAX_FILE), storage.join(source, VOCAB_FILE)
    if not (storage.exists(softmax_path) and storage.exists(vocab_path)):
        return
    if storage.read_bytes(vocab_path) != vocab:
        return
    with tempfile.TemporaryDirectory(prefix="elmo-init-") as tmp:
        local = os.path.join(tmp, SOFTMAX_FILE)
        storage.download_file(softmax_path, local)
        weight, bias = read_softmax(local)
    if weight.shape != tuple(softmax.weight.shape):
        raise TrainError(
            f"init_from {source}: softmax of shape {weight.shape}, the model's is {tuple(softmax.weight.shape)}"
        )
    with torch.no_grad():
        softmax.weight.copy_(torch.from_numpy(weight))
        softmax.bias.copy_(torch.from_numpy(bias))


def source_run(source: dict) -> str:
    """The run directory an export's ``source`` (its ``export.json``) comes from: ``run``, or the
    run holding ``checkpoint`` (``RUN/checkpoints/step-N``), or the checkpoint itself."""
    if source.get("run"):
        return str(source["run"]).rstrip("/")
    checkpoint = str(source.get("checkpoint", "")).rstrip("/")
    parent, _, _ = checkpoint.rpartition("/")
    run, _, folder = parent.rpartition("/")
    return run if folder == CHECKPOINTS and run else checkpoint


def check_export_folder(out_dir: str, overwrite: bool, source: dict) -> None:
    """Refuse (TrainError, one line) an ``out_dir`` that is not new, empty or an earlier export of
    the run ``source`` comes from (``export.json`` naming it, and the export's files, nothing else)
    unless ``overwrite``: ``elmo export`` must not replace a user's ``options.json`` and
    ``weights.hdf5`` (released ELMo files, say), nor another run's export."""
    if overwrite:
        return
    hint = ", or pass --overwrite to replace its export files and keep the rest"
    if not check_owned(out_dir, OWN_FILES, TrainError, overwrite_hint=hint):
        return
    marker = read_marker(out_dir, OWN_FILES, TrainError)
    if not (marker.get("run") or marker.get("checkpoint")):
        raise TrainError(
            f"{storage.join(out_dir, MARKER_FILE)} names no run or checkpoint: not an elmo export marker; "
            f"choose another output{hint}"
        )
    theirs, ours = source_run(marker), source_run(source)
    if theirs != ours:
        raise TrainError(
            f"output {out_dir} holds the export of {theirs} ({MARKER_FILE}), not of {ours}: choose another "
            f"output{hint}"
        )


def export_checkpoint(path: str, out_dir: str, overwrite: bool = False) -> list[str]:
    """``elmo export CHECKPOINT OUT``: a checkpoint directory (or a run directory: its latest
    checkpoint) exported to ``out_dir`` (see ``check_export_folder``)."""
    if not storage.exists(storage.join(path, ckpt.MODEL_FILE)):
        latest = ckpt.latest_checkpoint(path)
        if latest is None:
            raise ckpt.CheckpointError(f"{path}: neither a checkpoint nor a run directory with checkpoints")
        path = latest
    source = {"checkpoint": path}
    source["run"] = source_run(source)
    check_export_folder(out_dir, overwrite, source)
    bilm, softmax, payload = model_from_checkpoint(path)
    with taken_back_on_failure(out_dir, OWN_FILES), torch.no_grad():
        return export_model(bilm, softmax, payload["vocab"], out_dir, source)
