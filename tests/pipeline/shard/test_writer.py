import numpy as np

from pipeline.formats.shard_format import decode_block
from pipeline.shard.sentences import SplitSentences
from pipeline.shard.vocabulary import global_ids, local_vocabulary
from pipeline.shard.writer import Piece, block_bounds, cut_pieces, permute_ids, shard_samples, shuffled_order


def test_permute_ids_moves_whole_sentences():
    ids = np.array([1, 2, 3, 4, 5, 6], dtype=np.int32)
    lengths = np.array([2, 1, 3], dtype=np.int32)
    assert permute_ids(ids, lengths, np.array([2, 0, 1])).tolist() == [4, 5, 6, 1, 2, 3]


def test_block_bounds_respect_the_budget():
    assert block_bounds(np.array([3, 3, 5, 9, 1]), 6) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert block_bounds(np.array([], dtype=np.int32), 6) == []


def test_shuffle_depends_on_seed_split_and_shard_only():
    a = shuffled_order(100, 0, "train", 3)
    assert a.tolist() == shuffled_order(100, 0, "train", 3).tolist()
    assert sorted(a.tolist()) == list(range(100))
    assert a.tolist() != shuffled_order(100, 1, "train", 3).tolist()
    assert a.tolist() != shuffled_order(100, 0, "heldout", 3).tolist()


def _split_sentences(sentences: list[list[str]]) -> tuple[list[str], SplitSentences]:
    vocab, ids = local_vocabulary([t for s in sentences for t in s])
    text = "\n".join(" ".join(s) for s in sentences).encode()
    return vocab, SplitSentences(text, ids, np.array([len(s) for s in sentences], dtype=np.int32))


def test_cut_pieces_splits_a_chunk_at_shard_boundaries_with_vocabulary_ids():
    index = {"<S>": 0, "</S>": 1, "<UNK>": 2, "a": 3, "b": 4}
    sentences = [["a", "b"], ["b"], ["zz", "a", "a"], ["b", "b"], ["a"]]  # 9 tokens; zz is unknown
    vocab, part = _split_sentences(sentences)
    # 4 tokens before this chunk, 5-token shards: starts at 4, 6, 7, 10, 12 -> shards 0, 1, 1, 2, 2
    pieces = cut_pieces(part, global_ids(vocab, index), offset=4, shard_tokens=5, shards=range(0, 3))
    assert [p.lines for p in pieces] == [[b"a b"], [b"b", b"zz a a"], [b"b b", b"a"]]
    assert [p.ids.tolist() for p in pieces] == [[3, 4], [4, 2, 3, 3], [4, 4, 3]]
    assert [p.lengths.tolist() for p in pieces] == [[2], [1, 3], [2, 1]]
    # the split's last shard takes every sentence past it
    tail = cut_pieces(part, global_ids(vocab, index), offset=4, shard_tokens=5, shards=range(0, 2))
    assert [len(p.lines) for p in tail] == [1, 4]


def test_shard_samples_keep_sentences_and_ids_together():
    index = {"<S>": 0, "</S>": 1, "<UNK>": 2, **{f"w{i}": i + 3 for i in range(50)}}
    sentences = [[f"w{(i * 7 + j) % 50}" for j in range(i % 5 + 1)] for i in range(40)]
    vocab, part = _split_sentences(sentences)
    pieces = cut_pieces(part, global_ids(vocab, index), offset=0, shard_tokens=1000, shards=range(0, 1))
    assert len(pieces) == 1 and isinstance(pieces[0], Piece)
    blocks = [decode_block(s) for s in shard_samples(pieces, "train", 0, seed=5, block_tokens=12)]
    assert all(b.num_tokens <= 12 for b in blocks)
    got = [s for b in blocks for s in b.sentences]
    assert sorted(map(tuple, got)) == sorted(map(tuple, sentences)) and got != sentences
    for b in blocks:
        for tokens, ids in zip(b.sentences, b.sentence_ids(), strict=True):
            assert [index[t] for t in tokens] == ids.tolist()
