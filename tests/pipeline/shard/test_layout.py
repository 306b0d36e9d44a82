import numpy as np
import pytest

from pipeline.shard.layout import ChunkTokens, layout_split, sentence_shards


@pytest.mark.parametrize("seed, shard_tokens", [(0, 50), (1, 50), (2, 37), (3, 400)])
def test_layout_matches_a_direct_assignment_of_every_sentence(seed, shard_tokens):
    rng = np.random.default_rng(seed)
    chunks = [rng.integers(1, 30, size=rng.integers(0, 12)) for _ in range(40)]
    layout = layout_split(
        [ChunkTokens(int(c.sum()), int(c[-1]) if len(c) else 0) for c in chunks], shard_tokens, longest=29
    )
    all_lengths = np.concatenate(chunks)
    starts = np.concatenate(([0], np.cumsum(all_lengths)[:-1]))
    direct = starts // shard_tokens
    tail = all_lengths.sum() - direct.max() * shard_tokens
    if direct.max() > 0 and tail < shard_tokens // 2:
        direct = np.minimum(direct, direct.max() - 1)  # a short tail merged into the shard before
    assert layout.num_shards == direct.max() + 1
    assert set(direct.tolist()) == set(range(layout.num_shards))  # no empty shard
    pieces = [
        sentence_shards(c, layout.offsets[i], shard_tokens, layout.num_shards) for i, c in enumerate(chunks)
    ]
    assert np.concatenate(pieces).tolist() == direct.tolist()
    for i, owners in enumerate(pieces):
        assert sorted(set(owners.tolist())) == list(layout.chunk_shards[i])
    for shard, feeding in enumerate(layout.shard_chunks()):
        assert feeding == [i for i, owners in enumerate(pieces) if shard in owners]
    tokens_per_shard = np.bincount(direct, weights=all_lengths)
    if layout.num_shards > 1:
        assert tokens_per_shard.min() >= shard_tokens // 2 - 29
    assert tokens_per_shard.max() < 1.5 * shard_tokens + 29


def test_short_tail_joins_the_previous_shard():
    # 10 sentences of 10 tokens, budget 40: raw shards of 40, 40, 20 -> the 20-token tail stays (>= 20)
    assert layout_split([ChunkTokens(100, 10)], 40, longest=10).num_shards == 3
    # budget 45: raw shards 50, 40, 10 -> the tail of 10 (< 22) joins shard 1
    layout = layout_split([ChunkTokens(100, 10)], 45, longest=10)
    assert layout.num_shards == 2 and layout.chunk_shards == [range(0, 2)]
    assert sentence_shards(np.full(10, 10), 0, 45, 2).tolist() == [0] * 5 + [1] * 5
    assert layout_split([ChunkTokens(5, 5)], 45, longest=5).num_shards == 1


def test_a_sentence_longer_than_a_shard_is_refused():
    with pytest.raises(ValueError, match="more than shard_tokens=10"):
        layout_split([ChunkTokens(11, 11)], 10, longest=11)
