"""The two HDF5 layouts of an embedding shard (pipeline/embed/hdf5_shard.py): what they hold, that
they hold the same vectors, and that a packed shard's datasets are checked before they are used."""

from __future__ import annotations

import hashlib

import h5py
import numpy as np
import pytest
from embed_fixtures import write_shard_file

from pipeline.embed.errors import EmbedError
from pipeline.embed.hdf5_shard import iter_shard

WIDTH = 8


def token_values(lengths, layers: bool) -> list[np.ndarray]:
    """AllenNLP-shaped values, one per line: (3, n, 2P) with ``layers``, else (n, 2P)."""
    rng = np.random.default_rng(0)
    return [rng.standard_normal((3, n, WIDTH) if layers else (n, WIDTH)).astype(np.float32) for n in lengths]


@pytest.mark.parametrize("layout", ["allennlp", "packed"])
def test_a_shard_is_the_same_bytes_every_time_and_its_sha256_is_the_files(tmp_path, layout):
    values = token_values([4, 1, 7, 0], layers=True)  # the last line was empty
    first, again = tmp_path / "first.hdf5", tmp_path / "again.hdf5"
    digest = write_shard_file(first, 100, values, "float16", layout)
    assert write_shard_file(again, 100, values, "float16", layout) == digest
    # no timestamps: a rerun reproduces the bytes; the hash taken while writing is the file's
    assert first.read_bytes() == again.read_bytes()
    assert hashlib.sha256(first.read_bytes()).hexdigest() == digest


def test_a_packed_shard_of_no_tokens_is_still_a_shard(tmp_path):
    path = tmp_path / "empty.hdf5"
    digest = write_shard_file(path, 7, token_values([0, 0], layers=False), "float32", "packed")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert [(line, value.shape) for line, value in iter_shard(str(path))] == [
        (7, (0, WIDTH)),
        (8, (0, WIDTH)),
    ]


def test_the_allennlp_layout_is_one_dataset_per_line(tmp_path):
    values = token_values([4, 1, 7, 0], layers=True)  # the last line was empty
    path = tmp_path / "shard.hdf5"
    write_shard_file(path, 100, values, "float16")
    with h5py.File(path, "r") as f:
        assert sorted(f.keys(), key=int) == ["100", "101", "102", "103"]
        assert f["100"].dtype == np.float16 and f["103"].shape == (3, 0, WIDTH)
        np.testing.assert_array_equal(f["102"][()], values[2].astype(np.float16))


@pytest.mark.parametrize("pooled", [False, True], ids=["tokens", "pooled"])
@pytest.mark.parametrize("layers", [True, False], ids=["all", "top"])
def test_the_packed_layout_holds_the_same_vectors_as_the_allennlp_one(tmp_path, layers, pooled):
    values = token_values([4, 1, 7, 0, 2], layers)
    if pooled:  # one vector per sentence: (3, 2P) or (2P,)
        values = [
            v.mean(axis=-2) if v.shape[-2] else np.zeros(v.shape[:-2] + (WIDTH,), v.dtype) for v in values
        ]
    packed, allennlp = tmp_path / "packed.hdf5", tmp_path / "allennlp.hdf5"
    write_shard_file(packed, 40, values, "float16", "packed", pooled)
    write_shard_file(allennlp, 40, values, "float16", "allennlp", pooled)
    with h5py.File(packed, "r") as f:
        assert f.attrs["layout"] == "packed" and f["lines"][()].tolist() == [40, 41, 42, 43, 44]
        sizes = [1] * 5 if pooled else [4, 1, 7, 0, 2]
        assert f["offsets"][()].tolist() == np.concatenate([[0], np.cumsum(sizes)]).tolist()
        # a sentence's tokens (or its one pooled row) are contiguous rows: (rows, 3, 2P) with every layer
        assert f["vectors"].dtype == np.float16 and f["vectors"].shape[0] == sum(sizes)
        assert f["vectors"].ndim == (3 if layers else 2)
    read, expected = list(iter_shard(str(packed))), list(iter_shard(str(allennlp)))
    assert [line for line, _ in read] == [line for line, _ in expected] == [40, 41, 42, 43, 44]
    for (_, got), (_, want), value in zip(read, expected, values, strict=True):
        assert got.shape == want.shape == value.shape
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, value.astype(np.float16))


def _packed(tmp_path, change) -> str:
    path = tmp_path / "bad.hdf5"
    write_shard_file(path, 0, token_values([3, 2, 4], layers=True), "float32", "packed")
    with h5py.File(path, "r+") as f:
        change(f)
    return str(path)


def _offsets(f, values):
    del f["offsets"]
    f["offsets"] = np.array(values)


@pytest.mark.parametrize(
    "change",
    [
        lambda f: f["offsets"].__setitem__(2, 10**9),  # past the vectors
        lambda f: _offsets(f, [0, 5, 3, 9]),  # going back
        lambda f: _offsets(f, [0.0, 3.0, 5.0, 9.0]),  # not integers
        lambda f: _offsets(f, [0, 3, 9]),  # one sentence short of the lines
    ],
    ids=["past-the-end", "decreasing", "float", "short"],
)
def test_packed_datasets_that_disagree_are_refused(tmp_path, change):
    with pytest.raises(EmbedError, match="packed datasets do not agree"):
        list(iter_shard(_packed(tmp_path, change)))


def test_a_packed_dataset_outside_the_file_or_a_file_that_is_not_hdf5_is_refused(tmp_path):
    def link_out(f):
        del f["vectors"]
        f["vectors"] = h5py.ExternalLink("/etc/elsewhere.h5", "/vectors")

    with pytest.raises(EmbedError, match="needs the datasets vectors, offsets, lines in the file itself"):
        list(iter_shard(_packed(tmp_path, link_out)))
    text = tmp_path / "notes.hdf5"
    text.write_text("not hdf5")
    with pytest.raises(EmbedError, match=r"notes.hdf5: not a readable HDF5 file"):
        list(iter_shard(str(text)))
