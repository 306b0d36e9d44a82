import numpy as np
import pytest

from pipeline.shard.layout import ChunkTokens, layout_split, sentence_shards


def test_layout_matches_a_direct_assignment_of_every_sentence():
    rng = np.random.default_rng(0)
    chunks = [rng.integers(1, 30, size=rng.integers(0, 12)) for _ in range(40)]
    shard_tokens = 50
    layout = layout_split(
        [ChunkTokens(int(c.sum()), int(c[-1]) if len(c) else 0) for c in chunks], shard_tokens, longest=29
    )
    all_lengths = np.concatenate(chunks)
    starts = np.concatenate(([0], np.cumsum(all_lengths)[:-1]))
    direct = starts // shard_tokens
    assert layout.num_shards == direct.max() + 1
    assert set(direct.tolist()) == set(range(layout.num_shards))  # no empty shard
    pieces = [sentence_shards(c, layout.offsets[i], shard_tokens) for i, c in enumerate(chunks)]
    assert np.concatenate(pieces).tolist() == direct.tolist()
    for i, owners in enumerate(pieces):
        assert sorted(set(owners.tolist())) == list(layout.chunk_shards[i])
    for shard, feeding in enumerate(layout.shard_chunks()):
        assert feeding == [i for i, owners in enumerate(pieces) if shard in owners]
    tokens_per_shard = np.bincount(direct, weights=all_lengths)
    assert tokens_per_shard[:-1].min() >= shard_tokens - 29 and tokens_per_shard.max() < shard_tokens + 29


def test_a_sentence_longer_than_a_shard_is_refused():
    with pytest.raises(ValueError, match="more than shard_tokens=10"):
        layout_split([ChunkTokens(11, 11)], 10, longest=11)
