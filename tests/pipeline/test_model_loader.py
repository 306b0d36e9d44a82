"""The model loader every user of a trained model shares (pipeline/model_loader.py: embed,
ElmoEmbedder, probe): found, checked and hashed before any worker starts, each fault named with
its file in the caller's error class; the device picker."""

from __future__ import annotations

import json

import pytest

from pipeline.embed.errors import EmbedError
from pipeline.model_config import preset_options
from pipeline.model_loader import load_bilm, model_paths, resolve_model

OPTIONS = preset_options("tiny")


def model_dir(tmp_path, weights: bytes = b"weights"):
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "options.json").write_text(json.dumps(OPTIONS))
    (folder / "weights.hdf5").write_bytes(weights)
    return folder


def test_a_folder_or_two_files_but_not_both_nor_neither():
    assert model_paths("s3://b/m", "", "", EmbedError) == ("s3://b/m/options.json", "s3://b/m/weights.hdf5")
    assert model_paths("", "o.json", "w.hdf5", EmbedError) == ("o.json", "w.hdf5")
    with pytest.raises(EmbedError, match="either model=DIR or options_file \\+ weights_file, not both"):
        model_paths("m", "o.json", "", EmbedError)
    with pytest.raises(EmbedError, match="no model given"):
        model_paths("", "o.json", "", EmbedError)


def test_the_source_names_its_sizes_and_a_hash_of_both_files(tmp_path):
    folder = model_dir(tmp_path)
    source = resolve_model(str(folder), "", "", EmbedError)
    assert (source.num_layers, source.output_dim) == (3, 128)  # tiny: 2 layers of 64 projections
    assert source.weights_file == str(folder / "weights.hdf5")
    assert resolve_model(str(folder), "", "", EmbedError).sha256 == source.sha256
    model_dir(tmp_path, weights=b"other weights")
    assert resolve_model(str(folder), "", "", EmbedError).sha256 != source.sha256


def test_each_fault_is_named_with_its_file(tmp_path):
    folder = model_dir(tmp_path)
    (folder / "weights.hdf5").unlink()
    with pytest.raises(EmbedError, match=r"model weights file .*weights.hdf5 does not exist in model folder"):
        resolve_model(str(folder), "", "", EmbedError)
    folder = model_dir(tmp_path)
    (folder / "options.json").write_text("{")
    with pytest.raises(EmbedError, match=r"options.json is not valid JSON"):
        resolve_model(str(folder), "", "", EmbedError)
    (folder / "options.json").write_text(json.dumps({**OPTIONS, "lstm": {**OPTIONS["lstm"], "dim": -1}}))
    with pytest.raises(EmbedError, match=r"model options file .*options.json: "):
        resolve_model(str(folder), "", "", EmbedError)


def test_weights_that_do_not_load_are_named_in_one_line(tmp_path):
    source = resolve_model(str(model_dir(tmp_path, weights=b"not hdf5")), "", "", EmbedError)
    with pytest.raises(EmbedError, match=r"model weights .*weights.hdf5: cannot load \(") as err:
        load_bilm(source, EmbedError)
    assert "\n" not in str(err.value)


def test_each_user_gets_its_own_error_class_and_the_device_its_name_says(tmp_path, monkeypatch):
    """The probe and the embed stage load through the same functions; each fault is raised in the
    caller's error class (the probe's ProbeError), so the entry points report it in one line."""
    import torch

    from pipeline.model_loader import Device, check_files, load_files, pick_device
    from pipeline.probe.probe_set import ProbeError

    folder = model_dir(tmp_path)
    with pytest.raises(ProbeError, match=r"model weights file .*nowhere.hdf5 does not exist"):
        check_files(str(folder / "options.json"), str(folder / "nowhere.hdf5"), "", ProbeError)
    with pytest.raises(ProbeError, match=r"model weights .*weights.hdf5: cannot load \("):
        load_files(str(folder / "options.json"), str(folder / "weights.hdf5"), ProbeError)
    assert pick_device("cpu") == torch.device("cpu") and pick_device(Device.cpu) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device(Device.auto) == torch.device("cpu")
    with pytest.raises(ValueError):
        pick_device("tpu")
