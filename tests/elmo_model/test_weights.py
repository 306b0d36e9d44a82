"""bilm-tf HDF5 load/export (docs/weights.md)."""

from __future__ import annotations

import copy
import io
import json

import h5py
import numpy as np
import pytest
import torch
from elmo_reference import TINY_OPTIONS

from elmo_model import BiLM, BiLMOptions, WeightsError, batch_to_ids, load_weights, save_weights
from elmo_model.weights import expected_datasets

SENTENCES = [["The", "cat", "sat", "on", "the", "mat", "."], ["Hi"], ["Zürich", "naïve", "x" * 60]]


def listing(path) -> dict[str, tuple[tuple[int, ...], str]]:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda k, o: out.__setitem__(k, (o.shape, str(o.dtype))) if isinstance(o, h5py.Dataset) else None
        )
        assert not any(len(o.attrs) for o in [f] + [f[k] for k in out])
    return out


def test_export_reproduces_the_reference_files_exactly(reference, tmp_path):
    model = reference.load()
    model.save_files(tmp_path / "options.json", tmp_path / "weights.hdf5")
    ours, theirs = listing(tmp_path / "weights.hdf5"), listing(reference.weight_file)
    assert ours == theirs and len(ours) == 33
    assert set(ours) == set(expected_datasets(model.bilm_options))
    with h5py.File(tmp_path / "weights.hdf5", "r") as a, h5py.File(reference.weight_file, "r") as b:
        for key in ours:
            assert np.array_equal(a[key][()], b[key][()]), key
    written = json.loads((tmp_path / "options.json").read_text())
    original = json.loads(reference.options_file.read_text())
    assert written == original  # same keys and values (3 == 3.0 in JSON numbers)


def test_export_load_is_bit_exact_for_a_trained_style_model(tiny_model, tmp_path):
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # move away from the init pattern (e.g. zero biases)
        tiny_model.token_encoder.char_embedding.weight[0].zero_()
    tiny_model.save_files(tmp_path / "o.json", tmp_path / "w.hdf5")
    loaded = BiLM.from_files(tmp_path / "o.json", tmp_path / "w.hdf5")
    for (name, a), (_, b) in zip(tiny_model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    ids = batch_to_ids(SENTENCES)
    with torch.no_grad():
        assert torch.equal(tiny_model(ids).layers, loaded(ids).layers)
    with h5py.File(tmp_path / "w.hdf5", "r") as f:
        assert f["char_embed"].shape == (261, 3)
        # TF gate order with the forget bias NOT folded in: B's f block is the raw parameter.
        b_tf = f["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/B"][()].reshape(4, 12)
        b_internal = tiny_model.lstm.layers[0].bias[0].detach().numpy().reshape(4, 12)  # (i, f, o, j)
        assert np.array_equal(b_tf, b_internal[[0, 3, 1, 2]])


def test_file_objects_work(tiny_model):
    buffer = io.BytesIO()
    save_weights(tiny_model, buffer)
    buffer.seek(0)
    other = BiLM(TINY_OPTIONS)
    load_weights(other, buffer)
    assert all(torch.equal(a, b) for a, b in zip(tiny_model.parameters(), other.parameters(), strict=True))


def _copy_with(source, target, drop=None, replace=None, add=None):
    with h5py.File(source, "r") as src, h5py.File(target, "w") as dst:

        def visit(key, obj):
            if isinstance(obj, h5py.Dataset) and key != drop:
                dst.create_dataset(key, data=replace[1] if replace and key == replace[0] else obj[()])

        src.visititems(visit)
        for key, value in (add or {}).items():
            dst.create_dataset(key, data=value)


def test_malformed_files_name_the_dataset(reference, tmp_path):
    bad = tmp_path / "bad.hdf5"
    model = BiLM(BiLMOptions.from_file(reference.options_file))
    cell = "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell"
    _copy_with(reference.weight_file, bad, drop=f"{cell}/W_P_0")
    with pytest.raises(WeightsError, match=f"bad.hdf5: missing dataset '{cell}/W_P_0'"):
        load_weights(model, bad)
    _copy_with(reference.weight_file, bad, replace=("CNN/W_cnn_2", np.zeros((1, 3, 4, 15), np.float32)))
    with pytest.raises(
        WeightsError, match=r"'CNN/W_cnn_2' has shape \(1, 3, 4, 15\), expected \(1, 3, 4, 16\)"
    ):
        load_weights(model, bad)
    _copy_with(reference.weight_file, bad, replace=("char_embed", np.full((261, 4), np.nan, np.float32)))
    with pytest.raises(WeightsError, match="'char_embed' contains NaN"):
        load_weights(model, bad)
    # An unrelated extra dataset (e.g. an exported softmax) is ignored.
    _copy_with(reference.weight_file, bad, add={"softmax/W": np.zeros((5, 16), np.float32)})
    load_weights(model, bad)


def test_options_disagreeing_with_weights(reference, tmp_path):
    raw = json.loads(reference.options_file.read_text())
    fewer_highways = copy.deepcopy(raw)
    fewer_highways["char_cnn"]["n_highway"] = 1
    with pytest.raises(WeightsError, match="'CNN_high_1/.*' is not part of the model.*disagree"):
        load_weights(BiLM(fewer_highways), reference.weight_file)
    other_dim = copy.deepcopy(raw)
    other_dim["lstm"]["dim"] = 32
    with pytest.raises(
        WeightsError, match=r"RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0' has shape \(32, 256\)"
    ):
        load_weights(BiLM(other_dim), reference.weight_file)
    more_layers = copy.deepcopy(raw)
    more_layers["lstm"]["n_layers"] = 3
    with pytest.raises(WeightsError, match="missing dataset 'RNN_0/RNN/MultiRNNCell/Cell2/LSTMCell/W_0'"):
        load_weights(BiLM(more_layers), reference.weight_file)


def test_from_files_checks_the_weights_before_building_the_model(reference, tmp_path, monkeypatch):
    raw = json.loads(reference.options_file.read_text())
    raw["lstm"]["dim"] = 60000  # allowed on its own; the file's W_0 is (32, 256)
    options = tmp_path / "options.json"
    options.write_text(json.dumps(raw))
    built = []
    original = BiLM.__init__
    monkeypatch.setattr(BiLM, "__init__", lambda self, *a, **k: built.append(1) or original(self, *a, **k))
    with pytest.raises(WeightsError, match=r"W_0' has shape \(32, 256\), expected \(32, 240000\)"):
        BiLM.from_files(options, reference.weight_file)
    assert built == []  # nothing of 60000-wide LSTMs was allocated


def test_not_hdf5_names_the_file(tmp_path, reference):
    junk = tmp_path / "junk.hdf5"
    junk.write_bytes(b"not an hdf5 file")
    with pytest.raises(WeightsError, match="junk.hdf5: cannot open as HDF5"):
        BiLM.from_files(reference.options_file, junk)
    with pytest.raises(WeightsError, match="missing.hdf5: cannot open"):
        BiLM.from_files(reference.options_file, tmp_path / "missing.hdf5")


def _rewire(source, target, key: str, how: str, outside) -> None:
    """A copy of ``source`` where dataset ``key`` takes its values from the file ``outside``."""
    with h5py.File(source, "r") as src, h5py.File(target, "w") as dst:
        for name in [n for n in _datasets(src) if n != key]:
            dst.create_dataset(name, data=src[name][()])
        value = src[key][()]
        if how == "external link":
            with h5py.File(outside, "w") as other:
                other.create_dataset("values", data=value)
            dst[key] = h5py.ExternalLink(str(outside), "values")
        elif how == "soft link":
            dst.create_dataset("elsewhere", data=value)
            dst[key] = h5py.SoftLink("/elsewhere")
        else:  # external raw storage: the bytes live in a plain file beside
            value.astype(np.float32).tofile(outside)
            dst.create_dataset(
                key, shape=value.shape, dtype=np.float32, external=[(str(outside), 0, value.nbytes)]
            )


def _datasets(f) -> list[str]:
    out: list[str] = []
    f.visititems(lambda k, o: out.append(k) if isinstance(o, h5py.Dataset) else None)
    return out


@pytest.mark.parametrize("how", ["external link", "soft link", "external raw storage"])
def test_values_from_other_files_are_refused(reference, tmp_path, how):
    """The weights' hash covers the file only: a dataset whose values live elsewhere is refused."""
    bad = tmp_path / "bad.hdf5"
    key = "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0"
    _rewire(reference.weight_file, bad, key, how, tmp_path / "outside.bin")
    model = BiLM(BiLMOptions.from_file(reference.options_file))
    with pytest.raises(WeightsError, match=f"bad.hdf5: .*'{key}'.*stored in the file itself") as err:
        load_weights(model, bad)
    assert "\n" not in str(err.value)
