from collections import Counter

import numpy as np
import pytest

from pipeline.shard.vocabulary import (
    TokenCounts,
    build_vocabulary,
    global_ids,
    local_counts,
    local_vocabulary,
)


def test_order_is_specials_then_count_then_utf8_bytes():
    # ties: 'B' (0x42) < 'a' (0x61) < 'é' (0xc3 0xa9) < '中' (0xe4 ...) by UTF-8 bytes
    counts = Counter({"a": 2, "é": 2, "B": 2, "中": 2, "the": 5, "x": 1})
    vocab = build_vocabulary(counts, num_sentences=4)
    assert vocab.tokens == ["<S>", "</S>", "<UNK>", "the", "B", "a", "é", "中", "x"]
    assert vocab.counts == [4, 4, 0, 5, 2, 2, 2, 2, 1]
    assert sorted(vocab.tokens[4:8], key=lambda t: t.encode("utf-8")) == vocab.tokens[4:8]
    # the order does not depend on the order counts arrive in
    assert build_vocabulary(Counter(dict(reversed(list(counts.items())))), 4).tokens == vocab.tokens


def test_min_count_and_max_size_move_occurrences_to_unk():
    counts = Counter({"the": 9, "of": 5, "and": 5, "rare": 1, "once": 1})
    vocab = build_vocabulary(counts, num_sentences=3, min_count=2)
    assert vocab.tokens == ["<S>", "</S>", "<UNK>", "the", "and", "of"]
    assert vocab.counts[2] == 2
    vocab = build_vocabulary(counts, num_sentences=3, max_size=5)
    assert vocab.tokens == ["<S>", "</S>", "<UNK>", "the", "and"]
    assert vocab.counts[2] == 5 + 1 + 1
    assert sum(vocab.counts[2:]) == sum(counts.values())


def test_literal_specials_in_the_corpus_are_not_duplicated():
    vocab = build_vocabulary(Counter({"<UNK>": 3, "<S>": 1, "a": 1}), num_sentences=2)
    assert vocab.tokens == ["<S>", "</S>", "<UNK>", "a"]
    assert vocab.counts == [3, 2, 3, 1]


@pytest.mark.parametrize("kwargs", [{"min_count": 0}, {"max_size": 2}])
def test_bad_limits(kwargs):
    with pytest.raises(ValueError):
        build_vocabulary(Counter({"a": 1}), 1, **kwargs)


def test_vocab_files_and_hash():
    vocab = build_vocabulary(Counter({"b": 1, "a": 2}), 1)
    assert vocab.vocab_bytes == b"<S>\n</S>\n<UNK>\na\nb\n"
    assert vocab.counts_bytes == b"<S>\t1\n</S>\t1\n<UNK>\t0\na\t2\nb\t1\n"
    assert vocab.sha256 == build_vocabulary(Counter({"a": 2, "b": 1}), 1).sha256
    assert vocab.sha256 != build_vocabulary(Counter({"a": 2, "c": 1}), 1).sha256


def test_local_vocabulary_numbers_tokens_by_first_occurrence():
    vocab, ids = local_vocabulary(["b", "a", "b", "c", "a", "b"])
    assert vocab == ["b", "a", "c"]
    assert ids.dtype == np.int32 and ids.tolist() == [0, 1, 0, 2, 1, 0]
    assert [vocab[i] for i in ids] == ["b", "a", "b", "c", "a", "b"]
    empty_vocab, empty_ids = local_vocabulary([])
    assert empty_vocab == [] and empty_ids.shape == (0,) and empty_ids.dtype == np.int32


def test_local_counts_skip_tokens_that_do_not_occur():
    tokens, counts = local_counts(["b", "a", "c", "d"], np.array([0, 2, 0, 0, 3], dtype=np.int32))
    assert tokens == ["b", "c", "d"] and counts.tolist() == [3, 1, 1]


def test_global_ids_map_local_tokens_unknown_to_unk():
    vocab = build_vocabulary(Counter({"a": 2, "b": 1}), 2)
    lut = global_ids(["zz", "b", "a", "<UNK>"], vocab.index)
    assert lut.dtype == np.int32 and lut.tolist() == [2, 4, 3, 2]
    # a chunk's vocabulary ids are one gather away from its local ids
    local, ids = local_vocabulary(["a", "b", "a", "zz"])
    assert global_ids(local, vocab.index)[ids].tolist() == [3, 4, 3, 2]


def test_token_counts_sum_chunks_like_a_counter():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    expected: Counter = Counter()
    merged = TokenCounts()
    for _ in range(20):  # chunks with overlapping, growing vocabularies (the array must grow)
        chunk = [words[i] for i in rng.integers(0, 300, size=rng.integers(0, 200))]
        expected.update(chunk)
        merged.add(*local_counts(*local_vocabulary(chunk)))
    assert dict(merged.items()) == dict(expected) and len(merged) == len(expected)
    assert merged["w0"] == expected["w0"] and "nope" not in merged
    merged.add(["x", "x", "w1"], np.array([2, 3, 1]))  # a repeated token adds up in one slot
    assert merged["x"] == 5 and merged["w1"] == expected["w1"] + 1
    assert (
        build_vocabulary(merged, 7).tokens
        == build_vocabulary(expected | {"x": 5, "w1": merged["w1"]}, 7).tokens
    )
