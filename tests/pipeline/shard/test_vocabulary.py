from collections import Counter

import numpy as np
import pytest

from pipeline.shard.vocabulary import build_vocabulary, count_tokens, encode_ids


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


def test_count_and_encode_ids():
    sentences = [["a", "b", "a"], ["zz"]]
    assert count_tokens(sentences) == Counter({"a": 2, "b": 1, "zz": 1})
    vocab = build_vocabulary(Counter({"a": 2, "b": 1}), 2)
    ids, lengths = encode_ids(sentences, vocab.index)
    assert ids.dtype == np.int32 and ids.tolist() == [3, 4, 3, 2]
    assert lengths.tolist() == [3, 1]
