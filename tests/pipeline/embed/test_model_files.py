"""The model an embed run uses (pipeline/embed/model_files.py): found, checked and hashed before any
worker starts, each fault named with its file."""

from __future__ import annotations

import json

import pytest

from pipeline.embed.errors import EmbedError
from pipeline.embed.model_files import load_bilm, model_paths, resolve_model
from pipeline.model_config import preset_options

OPTIONS = preset_options("tiny")


def model_dir(tmp_path, weights: bytes = b"weights"):
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "options.json").write_text(json.dumps(OPTIONS))
    (folder / "weights.hdf5").write_bytes(weights)
    return folder


def test_a_folder_or_two_files_but_not_both_nor_neither():
    assert model_paths("s3://b/m", "", "") == ("s3://b/m/options.json", "s3://b/m/weights.hdf5")
    assert model_paths("", "o.json", "w.hdf5") == ("o.json", "w.hdf5")
    with pytest.raises(EmbedError, match="either model=DIR or options_file \\+ weights_file, not both"):
        model_paths("m", "o.json", "")
    with pytest.raises(EmbedError, match="no model given"):
        model_paths("", "o.json", "")


def test_the_source_names_its_sizes_and_a_hash_of_both_files(tmp_path):
    folder = model_dir(tmp_path)
    source = resolve_model(str(folder), "", "")
    assert (source.num_layers, source.output_dim) == (3, 128)  # tiny: 2 layers of 64 projections
    assert source.weights_file == str(folder / "weights.hdf5")
    assert resolve_model(str(folder), "", "").sha256 == source.sha256
    model_dir(tmp_path, weights=b"other weights")
    assert resolve_model(str(folder), "", "").sha256 != source.sha256


def test_each_fault_is_named_with_its_file(tmp_path):
    folder = model_dir(tmp_path)
    (folder / "weights.hdf5").unlink()
    with pytest.raises(EmbedError, match=r"model weights file .*weights.hdf5 does not exist in model folder"):
        resolve_model(str(folder), "", "")
    folder = model_dir(tmp_path)
    (folder / "options.json").write_text("{")
    with pytest.raises(EmbedError, match=r"options.json is not valid JSON"):
        resolve_model(str(folder), "", "")
    (folder / "options.json").write_text(json.dumps({**OPTIONS, "lstm": {**OPTIONS["lstm"], "dim": -1}}))
    with pytest.raises(EmbedError, match=r"model options file .*options.json: "):
        resolve_model(str(folder), "", "")


def test_weights_that_do_not_load_are_named_in_one_line(tmp_path):
    source = resolve_model(str(model_dir(tmp_path, weights=b"not hdf5")), "", "")
    with pytest.raises(EmbedError, match=r"model weights .*weights.hdf5: cannot load \(") as err:
        load_bilm(source)
    assert "\n" not in str(err.value)
