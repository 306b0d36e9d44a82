"""The exported softmax file is read back only when its datasets are what the trainer expects."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from pipeline.train.errors import TrainError
from pipeline.train.export import read_softmax


def _softmax_file(path, weight, bias):
    with h5py.File(path, "w") as f:
        f.create_dataset("softmax/W", data=weight)
        f.create_dataset("softmax/b", data=bias)
    return str(path)


def test_reads_float32_values(tmp_path):
    weight = np.arange(12, dtype=np.float64).reshape(4, 3) / 7
    path = _softmax_file(tmp_path / "softmax.hdf5", weight, np.ones(4, np.float16))
    got_w, got_b = read_softmax(path)
    assert got_w.dtype == got_b.dtype == np.float32
    np.testing.assert_allclose(got_w, weight, rtol=1e-6)
    np.testing.assert_array_equal(got_b, np.ones(4))


@pytest.mark.parametrize(
    "weight, bias, message",
    [
        (np.zeros((4, 3)), np.zeros(5), r"softmax/W \(4, 3\) and softmax/b \(5,\) are not"),
        (np.zeros(4), np.zeros(4), r"softmax/W \(4,\) and softmax/b \(4,\) are not"),
        (np.zeros((4, 3), np.int32), np.zeros(4), "needs float datasets"),
    ],
)
def test_bad_datasets_are_named(tmp_path, weight, bias, message):
    path = _softmax_file(tmp_path / "softmax.hdf5", weight, bias)
    with pytest.raises(TrainError, match=message):
        read_softmax(path)


def test_values_through_a_link_are_refused(tmp_path):
    other = _softmax_file(tmp_path / "other.hdf5", np.zeros((4, 3)), np.zeros(4))
    path = tmp_path / "softmax.hdf5"
    with h5py.File(path, "w") as f:
        f["softmax"] = h5py.ExternalLink(other, "softmax")
    with pytest.raises(TrainError, match="'softmax/W' is reached through an HDF5 ExternalLink"):
        read_softmax(str(path))


def test_missing_datasets(tmp_path):
    path = tmp_path / "softmax.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("softmax/W", data=np.zeros((4, 3)))
    with pytest.raises(TrainError, match="not a softmax file"):
        read_softmax(str(path))


def test_a_checkpoint_whose_options_disagree_with_its_tensors_is_refused_before_building(
    tmp_path, monkeypatch
):
    import copy

    from elmo_model import BiLM
    from pipeline.model_config import preset_options
    from pipeline.train import checkpoint as ckpt
    from pipeline.train.export import model_from_checkpoint
    from pipeline.train.objective import SharedSoftmax

    options = preset_options("tiny")
    bilm, softmax = BiLM(options), SharedSoftmax(10, options["lstm"]["projection_dim"])
    grown = copy.deepcopy(options)
    grown["lstm"]["dim"] = 60000  # a size of its own allowed; the tensors say otherwise
    path = str(tmp_path / "step-000000001")
    payload = {
        "options": grown,
        "bilm": bilm.state_dict(),
        "softmax": softmax.state_dict(),
        "vocab": b"<S>\n",
    }
    ckpt.save_model(path, payload)
    built = []
    original = BiLM.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(next(self.parameters()).device.type)

    monkeypatch.setattr(BiLM, "__init__", init)
    with pytest.raises(
        ckpt.CheckpointError,
        match=r"tensor 'lstm.layers.0.w_ih' is of shape .*, but its options need shape \(2, 64, 240000\)",
    ):
        model_from_checkpoint(path)
    assert built == ["meta"]  # only the shapes were built
    ckpt.save_model(path, {**payload, "options": options})
    model_from_checkpoint(path)
    assert built[-1] == "cpu"
