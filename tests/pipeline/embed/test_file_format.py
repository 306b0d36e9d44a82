"""The shard file formats as one registry (pipeline/embed/file_format.py): every format writes a
shard and reads it back through the same two calls, with the one spelling of shard names."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
from embed_fixtures import shard_of

from pipeline.embed import manifest
from pipeline.embed.errors import EmbedError
from pipeline.embed.file_format import FORMATS, chosen_format, format_named

RNG = np.random.default_rng(0)
VALUES = [RNG.standard_normal((3, n, 8)).astype(np.float32) for n in (2, 0, 5)]  # an empty line too
POOLED = [RNG.standard_normal((3, 8)).astype(np.float32) for _ in range(3)]


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("pooled", [False, True], ids=["tokens", "pooled"])
def test_every_format_round_trips_a_shard_through_the_registry(name, pooled):
    fmt = chosen_format(name, "packed")
    values = POOLED if pooled else VALUES
    shard = shard_of(40, values, pooled=pooled)
    out = io.BytesIO()
    digest = fmt.write(shard, out)
    data = out.getvalue()
    assert digest == hashlib.sha256(data).hexdigest()
    rows = shard.num_lines if pooled else int(sum(v.shape[-2] for v in values))
    read = list(fmt.read(data, "shard", pooled, rows))
    assert [line for line, _ in read] == [40, 41, 42]
    for (_, got), want in zip(read, values, strict=True):
        np.testing.assert_array_equal(got, want)
    name_of_shard = fmt.file_name(7)
    assert name_of_shard == f"embeddings-000007{fmt.suffix}" and manifest.SHARD_NAME.fullmatch(name_of_shard)
    with pytest.raises(ValueError, match="only once bound to a layout"):
        format_named(name).write(shard, io.BytesIO())  # a format found in a manifest reads, never writes


def test_a_format_this_version_does_not_know_is_one_line():
    with pytest.raises(
        EmbedError, match=r"shard file format 'arrow' is not one this version reads \(hdf5, parquet\)"
    ):
        format_named("arrow")
    assert not manifest.SHARD_NAME.fullmatch("embeddings-000001.arrow")
