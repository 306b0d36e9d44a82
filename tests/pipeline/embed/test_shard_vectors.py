"""pipeline.embed.shard_vectors: a shard's vectors assembled from compact pass outputs by bulk
copies, split lines joined, empty lines empty, and the pooled buffers reused."""

from __future__ import annotations

import numpy as np
import pytest
from embed_fixtures import sample_lines

from elmo_model.static_batches import BucketPlan
from pipeline.embed.inputs import plan_shards
from pipeline.embed.shard_vectors import BufferPool, ShardAssembler
from pipeline.embed.shard_work import WorkSettings, prepare_shard


@pytest.fixture()
def work(tmp_path):
    lines = sample_lines(20, start=300)
    lines[3] = b""
    lines[9] = b" ".join([b"w%d" % i for i in range(250)])  # pieces of 100, 100, 50
    path = tmp_path / "in.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    (spec,) = plan_shards("text", [str(path)], 100)
    settings = WorkSettings(False, 100, "split", "replace", BucketPlan(256, 8, fixed=True))
    return prepare_shard(spec, True, settings)


def _pass_output(work, indices, pooled: bool, spare: int = 3) -> np.ndarray:
    """What a pass hands over (OutputSpec.shape, width 2): each real token's row is its piece's
    position in the shard (pieces in line order), pooled the mean of those; then spare rows of
    padding, which must never be read."""
    starts = np.cumsum([0, *work.sizes])
    rows = [np.arange(starts[i], starts[i + 1], dtype=np.float32) for i in indices]
    values = np.stack([r.mean() for r in rows]) if pooled else np.concatenate(rows)
    values = np.concatenate([values, np.full(spare, -1.0, np.float32)])
    return values[:, None].repeat(2, 1)


@pytest.mark.parametrize("pool", [False, True], ids=["tokens", "pooled"])
def test_passes_land_where_their_lines_are_split_lines_joined_empty_lines_empty(work, pool):
    assembler = ShardAssembler(
        work.spec.first_line, work.num_lines, work.owner, work.sizes, (2,), np.float32, pool
    )
    for indices, _batch in reversed(work.passes):  # the order passes finish in does not matter
        assembler.place(indices, _pass_output(work, indices, pool))
    shard = assembler.finish()
    assert shard.num_lines == work.num_lines == 20 and shard.first_line == 0
    starts = np.cumsum([0, *work.sizes])
    for line in range(shard.num_lines):
        pieces = [p for p, owner in enumerate(work.owner) if owner == line]
        tokens = np.arange(starts[pieces[0]], starts[pieces[-1] + 1], dtype=np.float32) if pieces else []
        value = shard.value(line)
        if pool:  # a split line: the token-weighted mean of its pieces' means = the mean of its tokens
            expected = np.mean(tokens) if pieces else 0.0
            np.testing.assert_allclose(value, [expected] * 2, rtol=1e-6)
        else:
            assert value.shape == (len(tokens), 2)
            np.testing.assert_array_equal(value[:, 0], tokens)
    assert shard.value(3).shape == ((2,) if pool else (0, 2))  # the empty line
    if not pool:  # every token once, in line order
        np.testing.assert_array_equal(shard.vectors[:, 0], np.arange(sum(work.sizes)))
        assert shard.offsets[-1] == sum(work.sizes) and shard.offsets[10] - shard.offsets[9] == 250


def test_all_layers_are_stored_token_first_and_read_back_layer_first():
    assembler = ShardAssembler(5, 2, [0, 1], [2, 1], (3, 4), np.float16, pooled=False)
    values = np.arange(3 * 3 * 4, dtype=np.float16).reshape(3, 3, 4)  # (tokens, L, 2P)
    assembler.place([1, 0], np.concatenate([values[2:], values[:2]]))  # a pass ran line 1 first
    shard = assembler.finish()
    assert shard.vectors.shape == (3, 3, 4) and shard.vectors.dtype == np.float16
    np.testing.assert_array_equal(shard.value(0), values[:2].swapaxes(0, 1))  # (L, n, 2P)
    np.testing.assert_array_equal(shard.value(1), values[2:].swapaxes(0, 1))


def test_a_pool_hands_out_its_buffers_again_and_a_larger_one_when_needed():
    pool = BufferPool()
    first = pool.take((10, 4), np.float32)
    pool.give(first)
    again = pool.take((5, 4), np.float16)
    assert np.shares_memory(again, first) and again.shape == (5, 4) and again.dtype == np.float16
    other = pool.take((2, 2), np.float32)  # the one buffer is in use: a new one
    assert not np.shares_memory(other, first)
    pool.give(again)
    pool.give(other)
    larger = pool.take((100, 4), np.float32)  # too large for both: the larger of them is dropped
    assert not np.shares_memory(larger, first) and len(pool._free) == 1
    pool.give(larger)
    assembler = ShardAssembler(0, 1, [0], [3], (4,), np.float32, False, pool)
    assembler.place([0], np.ones((3, 4), np.float32))
    shard = assembler.finish()
    assert np.shares_memory(shard.vectors, larger)  # the one that fits (the other is 16 bytes)
    pool.release(shard)
    assert len(pool._free) == 2


def test_a_record_is_pooled_as_the_token_weighted_mean_of_its_sentences():
    from pipeline.embed.shard_vectors import RecordKeys, ShardVectors, pooled_by_record

    rng = np.random.default_rng(3)
    means = rng.standard_normal((5, 2, 4)).astype(np.float32)  # 5 sentences, layers=all of 2 x 4
    tokens = np.array([3, 1, 0, 2, 4])  # sentence 2 is empty (zeros, no weight)
    means[2] = 0
    keys = RecordKeys(["a", "a", "b", "c", "c"], np.array([0, 1, 0, 0, 1], dtype=np.int32))
    shard = ShardVectors(40, means, np.arange(6), True, tokens, keys)
    records = pooled_by_record(shard)
    assert records.records.ids == ["a", "b", "c"] and records.records.sentence.tolist() == [2, 1, 2]
    assert records.line_numbers.tolist() == [40, 42, 43] and records.tokens.tolist() == [4, 0, 6]
    np.testing.assert_allclose(records.vectors[0], (3 * means[0] + means[1]) / 4, atol=1e-6)
    np.testing.assert_array_equal(records.vectors[1], 0)  # a record without tokens
    np.testing.assert_allclose(records.vectors[2], (2 * means[3] + 4 * means[4]) / 6, atol=1e-6)
    assert records.vectors.dtype == np.float32 and records.offsets.tolist() == [0, 1, 2, 3]
